"""POST /tokenize, POST /detokenize (vLLM-like, with llama.cpp's field
names accepted too) and GET /v1/models/{id}: the real Llama-2 tokenizer's
golden ids, round trips, and errors."""
import requests

from dolphin_server import API_KEY, check_error, golden


def test_tokenize_golden_llama2(tiny_server):
    for case in golden("tokenizer-llama2")["cases"]:
        r = tiny_server.post("/tokenize", {"prompt": case["text"], "add_special_tokens": False})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokens"] == case["ids"], case["text"]
        assert body["count"] == len(case["ids"])
        assert body["max_model_len"] == 1024
        with_bos = tiny_server.post("/tokenize", {"prompt": case["text"]}).json()
        assert with_bos["tokens"] == [1] + case["ids"]
        back = tiny_server.post("/detokenize", {"tokens": case["ids"]})
        assert back.status_code == 200, back.text
        assert back.json() == {"prompt": case["decoded"], "content": case["decoded"]}


def test_tokenize_matches_completion_prompt(server, stories_golden):
    for case in stories_golden["cases"]:
        got = server.post("/tokenize", {"prompt": case["prompt"]}).json()["tokens"]
        assert got == case["prompt_ids"]
        r = server.complete({"prompt": case["prompt"], "max_tokens": 1})
        assert r.json()["usage"]["prompt_tokens"] == len(got)


def test_tokenize_llama_cpp_fields(tiny_server):
    """llama.cpp's /tokenize names the text `content` and adds BOS only with
    `add_special: true`; its /detokenize answers `content`."""
    case = golden("tokenizer-llama2")["cases"][0]
    r = tiny_server.post("/tokenize", {"content": case["text"]})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == case["ids"]
    r = tiny_server.post("/tokenize", {"content": case["text"], "add_special": True})
    assert r.json()["tokens"] == [1] + case["ids"]
    # vLLM's flag wins when both are given, for either spelling of the text
    r = tiny_server.post("/tokenize", {"content": case["text"], "add_special": False,
                                       "add_special_tokens": True})
    assert r.json()["tokens"] == [1] + case["ids"]
    r = tiny_server.post("/tokenize", {"prompt": case["text"], "add_special": False})
    assert r.json()["tokens"] == case["ids"]
    assert tiny_server.post("/detokenize", {"tokens": case["ids"]}).json()["content"] == \
        case["decoded"]


def test_detokenize_specials_and_empty(tiny_server):
    def text(ids):
        body = tiny_server.post("/detokenize", {"tokens": ids}).json()
        assert body["content"] == body["prompt"]
        return body["prompt"]
    assert text([]) == ""
    # BOS/EOS decode to nothing; a lone byte-fallback token to U+FFFD
    assert text([1, 15043, 2]) == "Hello"
    assert text([0xE4 + 3]) == "\ufffd"


def test_tokenize_errors(server):
    check_error(server.post("/tokenize", {}), 400, param="prompt")
    check_error(server.post("/tokenize", {"prompt": 5}), 400, param="prompt")
    check_error(server.post("/tokenize", {"prompt": ["a"]}), 400, param="prompt")
    check_error(server.post("/tokenize", {"prompt": "a", "messages": []}), 400,
                       param="messages")
    check_error(server.post("/tokenize", {"prompt": "a", "add_special_tokens": 1}), 400,
                       param="add_special_tokens")
    check_error(server.post("/tokenize", {"content": "a", "add_special": "yes"}), 400,
                       param="add_special")
    check_error(server.post("/tokenize", {"content": 5}), 400, param="content")
    check_error(server.post("/tokenize", {"prompt": "a", "content": "a"}), 400,
                       param="content")
    check_error(server.post("/tokenize", {"content": "a", "messages": []}), 400,
                       param="messages")
    check_error(server.post("/tokenize", {"prompt": "a", "model": "nope"}), 404,
                       param="model", code="model_not_found")
    check_error(server.post("/tokenize", [1, 2]), 400)
    r = requests.post(server.url + "/tokenize", data=b'{"prompt": "a"', timeout=10,
                      headers={"Content-Type": "application/json"})
    check_error(r, 400)
    r = requests.get(server.url + "/tokenize", timeout=10)
    check_error(r, 405)
    assert r.headers["Allow"] == "POST"


def test_detokenize_errors(server):
    check_error(server.post("/detokenize", {}), 400, param="tokens")
    check_error(server.post("/detokenize", {"tokens": "1 2"}), 400, param="tokens")
    for bad in ([512], [-1], [1.5], ["1"], [None], [2 ** 40]):
        check_error(server.post("/detokenize", {"tokens": bad}), 400, param="tokens")
    check_error(server.post("/detokenize", {"tokens": [1], "model": "x"}), 404,
                       param="model")
    check_error(requests.put(server.url + "/detokenize", timeout=10), 405)


def test_tokenizer_routes_need_api_key(auth_server):
    for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
        check_error(auth_server.post(path, body), 401)
        r = auth_server.post(path, body, headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 200, r.text


def test_model_by_id(server):
    r = requests.get(server.url + "/v1/models/stories260K", timeout=10)
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["id"] == "stories260K" and m["object"] == "model"
    assert isinstance(m["created"], int) and m["owned_by"]
    listed = requests.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert listed == [m]
    check_error(requests.get(server.url + "/v1/models/gpt-4", timeout=10), 404,
                       param="model", code="model_not_found")
    check_error(requests.post(server.url + "/v1/models/stories260K", timeout=10), 405)


def test_model_by_id_needs_api_key(auth_server):
    check_error(requests.get(auth_server.url + "/v1/models/stories260K", timeout=10),
                       401)
    r = requests.get(auth_server.url + "/v1/models/stories260K", timeout=10,
                     headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200

/* src/constrain/schema.c — compiling a response_format into a grammar: the
 * JSON-object grammar, and the JSON Schema subset of docs/api.md ("Structured
 * output") into grammar nodes. Every keyword outside the subset is refused
 * with its JSON pointer; nothing is ignored. Also the grammar's life
 * (reference counts) and the cache of compiled schemas. */
#include "constrain/grammar_priv.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the grammar object ---------------------------------------------------- */

static atomic_uint g_next_uid = 1;

dol_grammar *dol_grammar_alloc(void)
{
    dol_grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    atomic_init(&g->refs, 1);
    g->uid = atomic_fetch_add(&g_next_uid, 1);
    g->root = -1;
    return g;
}

int dol_grammar_add_node(dol_grammar *g, int kind)
{
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
        gnode *n = realloc(g->nodes, sizeof *n * (size_t)cap);
        if (!n) return -1;
        g->nodes = n;
        g->cap_nodes = cap;
    }
    gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->target = -1;
    n->additional = -1;
    n->items = GN_NO_ITEMS;
    n->max_items = -1;
    n->max_len = -1;
    g->n_states++;
    return g->n_nodes++;
}

int dol_grammar_add_lit(dol_grammar *g, const char *s, size_t n)
{
    if (g->n_lits == g->cap_lits) {
        int cap = g->cap_lits ? g->cap_lits * 2 : 16;
        char **l = realloc(g->lits, sizeof *l * (size_t)cap);
        if (!l) return -1;
        g->lits = l;
        int *ll = realloc(g->lit_len, sizeof *ll * (size_t)cap);
        if (!ll) return -1;
        g->lit_len = ll;
        g->cap_lits = cap;
    }
    char *c = malloc(n + 1);
    if (!c) return -1;
    memcpy(c, s, n);
    c[n] = '\0';
    g->lits[g->n_lits] = c;
    g->lit_len[g->n_lits] = (int)n;
    g->n_states += (int)n;
    return g->n_lits++;
}

static int lit_cmp(const char *a, int la, const char *b, int lb)
{
    int c = memcmp(a, b, (size_t)(la < lb ? la : lb));
    return c ? c : la - lb;
}

typedef struct { char *s; int len; } lit_ref;

static int lit_ref_cmp(const void *a, const void *b)
{
    const lit_ref *x = a, *y = b;
    return lit_cmp(x->s, x->len, y->s, y->len);
}

void dol_grammar_sort_lits(dol_grammar *g, int first, int n, int *perm)
{
    lit_ref *tmp = !perm && n > 16 ? malloc(sizeof *tmp * (size_t)n) : NULL;
    if (tmp) {   /* long enum lists: O(n log n) */
        for (int i = 0; i < n; i++) tmp[i] = (lit_ref){g->lits[first + i], g->lit_len[first + i]};
        qsort(tmp, (size_t)n, sizeof *tmp, lit_ref_cmp);
        for (int i = 0; i < n; i++) { g->lits[first + i] = tmp[i].s; g->lit_len[first + i] = tmp[i].len; }
        free(tmp);
        return;
    }
    /* insertion sort: literal lists are short, and perm must follow */
    for (int i = first + 1; i < first + n; i++) {
        char *s = g->lits[i];
        int l = g->lit_len[i], p = perm ? perm[i - first] : 0, j = i;
        while (j > first && lit_cmp(g->lits[j - 1], g->lit_len[j - 1], s, l) > 0) {
            g->lits[j] = g->lits[j - 1];
            g->lit_len[j] = g->lit_len[j - 1];
            if (perm) perm[j - first] = perm[j - 1 - first];
            j--;
        }
        g->lits[j] = s;
        g->lit_len[j] = l;
        if (perm) perm[j - first] = p;
    }
}

static void grammar_free(dol_grammar *g)
{
    for (int i = 0; i < g->n_nodes; i++) {
        gnode *n = &g->nodes[i];
        free(n->alts);
        free(n->prop_node);
        free(n->key_prop);
        free(n->prefix);
    }
    for (int i = 0; i < g->n_lits; i++) free(g->lits[i]);
    free(g->lits);
    free(g->lit_len);
    free(g->nodes);
    free(g);
}

void dol_grammar_retain(dol_grammar *g) { atomic_fetch_add(&g->refs, 1); }

void dol_grammar_release(dol_grammar *g)
{
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) grammar_free(g);
}

int dol_grammar_n_states(const dol_grammar *g) { return g->n_states; }

/* A literal node over n texts. -1 on OOM. */
static int literal_node(dol_grammar *g, const char *const *texts, int n)
{
    int id = dol_grammar_add_node(g, GN_LITERAL);
    if (id < 0) return -1;
    int first = g->n_lits;
    for (int i = 0; i < n; i++)
        if (dol_grammar_add_lit(g, texts[i], strlen(texts[i])) < 0) return -1;
    dol_grammar_sort_lits(g, first, n, NULL);
    g->nodes[id].lit_first = first;
    g->nodes[id].n_lit = n;
    return id;
}

int dol_grammar_any_node(dol_grammar *g, int *cache)
{
    if (*cache >= 0) return *cache;
    int any = dol_grammar_add_node(g, GN_ANYOF);
    if (any < 0) return -1;
    *cache = any;
    int obj = dol_grammar_add_node(g, GN_OBJECT);
    int arr = dol_grammar_add_node(g, GN_ARRAY);
    int str = dol_grammar_add_node(g, GN_STRING);
    int num = dol_grammar_add_node(g, GN_NUMBER);
    static const char *const words[] = {"true", "false", "null"};
    int lit = literal_node(g, words, 3);
    int *alts = malloc(sizeof(int) * 5);
    if (obj < 0 || arr < 0 || str < 0 || num < 0 || lit < 0 || !alts) { free(alts); return -1; }
    g->nodes[obj].additional = any;
    g->nodes[arr].items = any;
    alts[0] = obj; alts[1] = arr; alts[2] = str; alts[3] = num; alts[4] = lit;
    g->nodes[any].alts = alts;
    g->nodes[any].n_alts = 5;
    return any;
}

/* The height of node id from the current heights (see dol_grammar_heights). */
static int node_height(const dol_grammar *g, int id)
{
    if (id < 0) return GN_NO_VALUE;
    const gnode *n = &g->nodes[id];
    int h = 1;
    switch (n->kind) {
    case GN_ALIAS: return n->target >= 0 ? g->nodes[n->target].height : GN_NO_VALUE;
    case GN_ANYOF:
        h = GN_NO_VALUE;
        for (int i = 0; i < n->n_alts; i++)
            if (g->nodes[n->alts[i]].height < h) h = g->nodes[n->alts[i]].height;
        return h;
    case GN_OBJECT:
        h = 1;   /* the key's frame */
        for (int i = 0; i < n->n_props; i++)
            if (n->required >> i & 1) {
                int c = n->prop_node[i] >= 0 ? g->nodes[n->prop_node[i]].height : GN_NO_VALUE;
                if (c > h) h = c;
            }
        return h >= GN_NO_VALUE ? GN_NO_VALUE : h + 1;
    case GN_ARRAY:
        for (int i = 0; i < n->min_items; i++) {
            int it = i < n->n_prefix ? n->prefix[i] : n->items;
            int c = it >= 0 ? g->nodes[it].height : GN_NO_VALUE;
            if (c > h) h = c;
            if (i >= n->n_prefix) break;   /* the rest are all `items` */
        }
        return h >= GN_NO_VALUE ? GN_NO_VALUE : h + 1;
    default: return 1;
    }
}

void dol_grammar_heights(dol_grammar *g)
{
    for (int i = 0; i < g->n_nodes; i++) g->nodes[i].height = GN_NO_VALUE;
    /* heights only fall; each round settles at least one more node */
    for (bool changed = true; changed; ) {
        changed = false;
        for (int i = 0; i < g->n_nodes; i++) {
            int h = node_height(g, i);
            if (h < g->nodes[i].height) { g->nodes[i].height = h; changed = true; }
        }
    }
    g->max_height = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].height < GN_NO_VALUE && g->nodes[i].height > g->max_height)
            g->max_height = g->nodes[i].height;
}

/* ---- json_object ------------------------------------------------------------ */

static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static dol_grammar *g_json_object;

dol_grammar *dol_grammar_json_object(void)
{
    pthread_mutex_lock(&g_cache_mu);
    if (!g_json_object) {
        dol_grammar *g = dol_grammar_alloc();
        int any = -1;
        int obj = g ? dol_grammar_add_node(g, GN_OBJECT) : -1;
        if (obj >= 0 && dol_grammar_any_node(g, &any) >= 0) {
            g->nodes[obj].additional = any;
            g->root = obj;
            dol_grammar_heights(g);
            g_json_object = g;   /* the cache's reference, kept for the process */
        } else if (g) {
            grammar_free(g);
        }
    }
    dol_grammar *g = g_json_object;
    if (g) dol_grammar_retain(g);
    pthread_mutex_unlock(&g_cache_mu);
    return g;
}

/* ---- JSON Schema ------------------------------------------------------------ */

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_INTEGER = 8, T_NUMBER = 16,
       T_BOOLEAN = 32, T_NULL = 64, T_ALL = 127 };

#define MAX_DEFS 256
#define MAX_COMPILE_DEPTH 64

typedef struct {
    dol_grammar *g;
    const cJSON *root;
    int max_states;
    char *msg;
    size_t msglen;
    bool oom, failed;
    int any;                    /* node of any value, or -1 */
    const char *def_name[MAX_DEFS];
    int def_node[MAX_DEFS];
    int n_defs;
    int depth;
    char **npath;               /* per node: the pointer of the schema it came from */
    int cap_npath;
} cctx;

static int fail(cctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(cctx *c, const char *fmt, ...)
{
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, c->msglen, fmt, ap);
        va_end(ap);
    }
    c->failed = true;
    return -1;
}

static int oom(cctx *c)
{
    c->oom = true;
    return fail(c, "out of memory");
}

/* path + "/" + key, JSON-pointer escaped; truncated to fit. */
static void path_join(char *out, size_t n, const char *path, const char *key)
{
    size_t l = (size_t)snprintf(out, n, "%s/", path);
    for (const char *k = key; *k && l + 3 < n; k++) {
        if (*k == '~') { out[l++] = '~'; out[l++] = '0'; }
        else if (*k == '/') { out[l++] = '~'; out[l++] = '1'; }
        else out[l++] = *k;
    }
    if (l < n) out[l] = '\0';
}

static const char *ptr_or_root(const char *path) { return path[0] ? path : "/"; }

static bool is_annotation(const char *k)
{
    static const char *const ann[] = {"title", "description", "$schema", "$id", "$comment",
                                      "default", "examples", "deprecated", "readOnly",
                                      "writeOnly", "$defs", "definitions"};
    for (size_t i = 0; i < sizeof ann / sizeof ann[0]; i++)
        if (strcmp(k, ann[i]) == 0) return true;
    return false;
}

/* The types a keyword constrains (0: not type-specific). */
static int keyword_types(const char *k)
{
    static const struct { const char *k; int t; } kw[] = {
        {"properties", T_OBJECT}, {"required", T_OBJECT}, {"additionalProperties", T_OBJECT},
        {"items", T_ARRAY}, {"prefixItems", T_ARRAY}, {"minItems", T_ARRAY}, {"maxItems", T_ARRAY},
        {"minLength", T_STRING}, {"maxLength", T_STRING}, {"format", T_STRING},
        {"minimum", T_INTEGER}, {"maximum", T_INTEGER},
    };
    for (size_t i = 0; i < sizeof kw / sizeof kw[0]; i++)
        if (strcmp(k, kw[i].k) == 0) return kw[i].t;
    return 0;
}

static bool is_supported(const char *k)
{
    static const char *const ok[] = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (strcmp(k, ok[i]) == 0) return true;
    return keyword_types(k) != 0 || is_annotation(k);
}

static int compile(cctx *c, const cJSON *s, const char *path);

static int type_bit(const char *t)
{
    static const char *const names[] = {"object", "array", "string", "integer", "number",
                                        "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (strcmp(t, names[i]) == 0) return 1 << i;
    return 0;
}

static int parse_types(cctx *c, const cJSON *t, const char *path, int *mask)
{
    char p[256];
    path_join(p, sizeof p, path, "type");
    *mask = 0;
    if (cJSON_IsString(t)) {
        *mask = type_bit(t->valuestring);
    } else if (cJSON_IsArray(t) && cJSON_GetArraySize(t) > 0) {
        const cJSON *x;
        cJSON_ArrayForEach(x, t) {
            int b = cJSON_IsString(x) ? type_bit(x->valuestring) : 0;
            if (!b) { *mask = 0; break; }
            *mask |= b;
        }
    }
    if (!*mask) return fail(c, "invalid schema: 'type' at %s must be a type name or a "
                            "non-empty array of them", p);
    return 0;
}

static int json_type_of(const cJSON *v)
{
    if (cJSON_IsObject(v)) return T_OBJECT;
    if (cJSON_IsArray(v)) return T_ARRAY;
    if (cJSON_IsString(v)) return T_STRING;
    if (cJSON_IsBool(v)) return T_BOOLEAN;
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsNumber(v))
        return v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 9e15
                   ? T_INTEGER | T_NUMBER : T_NUMBER;
    return 0;
}

/* enum / const: the literal texts that also fit the type mask. */
static int compile_literals(cctx *c, const cJSON *vals, bool is_const, int types,
                            const char *path)
{
    char p[256];
    path_join(p, sizeof p, path, is_const ? "const" : "enum");
    int n = is_const ? 1 : cJSON_GetArraySize(vals);
    if (!is_const && (!cJSON_IsArray(vals) || n == 0))
        return fail(c, "invalid schema: 'enum' at %s must be a non-empty array", p);
    int id = dol_grammar_add_node(c->g, GN_LITERAL);
    if (id < 0) return oom(c);
    int first = c->g->n_lits, kept = 0;
    const cJSON *x = is_const ? vals : vals->child;
    for (int i = 0; i < n; i++, x = x->next) {
        if (!(json_type_of(x) & types)) continue;
        char *t = cJSON_PrintUnformatted(x);
        if (!t) return oom(c);
        int rc = dol_grammar_add_lit(c->g, t, strlen(t));
        free(t);
        if (rc < 0) return oom(c);
        kept++;
        if (c->g->n_states > c->max_states)
            return fail(c, "the schema's automaton would have more than %d states "
                        "(max_grammar_states)", c->max_states);
    }
    if (kept == 0)
        return fail(c, "invalid schema: no value of '%s' at %s matches its 'type'",
                    is_const ? "const" : "enum", p);
    dol_grammar_sort_lits(c->g, first, kept, NULL);
    /* duplicates are neighbours once sorted: keep one of each */
    int w = first + 1;
    for (int r = first + 1; r < first + kept; r++) {
        if (strcmp(c->g->lits[r], c->g->lits[w - 1]) == 0) {
            c->g->n_states -= c->g->lit_len[r];
            free(c->g->lits[r]);
            continue;
        }
        c->g->lits[w] = c->g->lits[r];
        c->g->lit_len[w++] = c->g->lit_len[r];
    }
    kept = w - first;
    c->g->n_lits = w;
    c->g->nodes[id].lit_first = first;
    c->g->nodes[id].n_lit = kept;
    return id;
}

static int get_count(cctx *c, const cJSON *s, const char *key, const char *path, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return 0;
    char p[256];
    path_join(p, sizeof p, path, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > 1e6)
        return fail(c, "invalid schema: '%s' at %s must be a non-negative integer "
                    "(at most 1000000)", key, p);
    *out = (int)v->valuedouble;
    return 0;
}

static int compile_object(cctx *c, const cJSON *s, const char *path)
{
    dol_grammar *g = c->g;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char p[256], q[512];
    if (props && !cJSON_IsObject(props)) {
        path_join(p, sizeof p, path, "properties");
        return fail(c, "invalid schema: 'properties' at %s must be an object", p);
    }
    if (req && !cJSON_IsArray(req)) {
        path_join(p, sizeof p, path, "required");
        return fail(c, "invalid schema: 'required' at %s must be an array of strings", p);
    }
    /* property names: the declared ones, then required ones not declared */
    const char *names[GN_MAX_PROPS];
    const cJSON *schemas[GN_MAX_PROPS];
    int n = 0;
    const cJSON *x;
    if (props) cJSON_ArrayForEach(x, props) {
        if (n == GN_MAX_PROPS) goto too_many;
        names[n] = x->string;
        schemas[n++] = x;
    }
    uint64_t required = 0;
    if (req) cJSON_ArrayForEach(x, req) {
        path_join(p, sizeof p, path, "required");
        if (!cJSON_IsString(x))
            return fail(c, "invalid schema: 'required' at %s must be an array of strings", p);
        int k = 0;
        while (k < n && strcmp(names[k], x->valuestring) != 0) k++;
        if (k == n) {
            if (cJSON_IsFalse(add))
                return fail(c, "invalid schema: required property '%.64s' at %s is not in "
                            "'properties' and additionalProperties is false", x->valuestring, p);
            if (n == GN_MAX_PROPS) goto too_many;
            names[n] = x->valuestring;
            schemas[n++] = NULL;   /* the additionalProperties schema */
        }
        required |= 1ull << k;
    }
    int additional = -1;
    if (!add || cJSON_IsTrue(add)) {
        additional = dol_grammar_any_node(g, &c->any);
        if (additional < 0) return oom(c);
    } else if (cJSON_IsObject(add)) {
        path_join(p, sizeof p, path, "additionalProperties");
        additional = compile(c, add, p);
        if (additional < 0) return -1;
    } else if (!cJSON_IsFalse(add)) {
        path_join(p, sizeof p, path, "additionalProperties");
        return fail(c, "invalid schema: 'additionalProperties' at %s must be a boolean or "
                    "a schema", p);
    }
    int id = dol_grammar_add_node(g, GN_OBJECT);
    if (id < 0) return oom(c);
    int *pn = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int *kp = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!pn || !kp) { free(pn); free(kp); return oom(c); }
    g->nodes[id].prop_node = pn;
    g->nodes[id].key_prop = kp;
    g->nodes[id].n_props = n;
    g->nodes[id].required = required;
    g->nodes[id].additional = additional;
    int key_first = g->n_lits;
    for (int i = 0; i < n; i++) {
        cJSON *js = cJSON_CreateString(names[i]);
        char *t = js ? cJSON_PrintUnformatted(js) : NULL;
        cJSON_Delete(js);
        if (!t) return oom(c);
        int rc = dol_grammar_add_lit(g, t + 1, strlen(t + 1)); /* without the opening quote */
        free(t);
        if (rc < 0) return oom(c);
        kp[i] = i;
    }
    g->nodes[id].key_first = key_first;
    dol_grammar_sort_lits(g, key_first, n, kp);
    for (int i = 0; i < n; i++) {
        int node;
        if (schemas[i]) {
            path_join(p, sizeof p, path, "properties");
            path_join(q, sizeof q, p, names[i]);
            node = compile(c, schemas[i], q);
        } else {
            node = additional;
        }
        if (node < 0) return -1;
        g->nodes[id].prop_node[i] = node;
    }
    return id;
too_many:
    return fail(c, "'properties' at %s: more than %d properties in one object are not "
                "supported", ptr_or_root(path), GN_MAX_PROPS);
}

static int compile_array(cctx *c, const cJSON *s, const char *path)
{
    dol_grammar *g = c->g;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    char p[256], q[300];
    int min = 0, max = -1;
    if (get_count(c, s, "minItems", path, &min)) return -1;
    if (cJSON_GetObjectItemCaseSensitive(s, "maxItems") && get_count(c, s, "maxItems", path, &max))
        return -1;
    if (max >= 0 && max < min)
        return fail(c, "invalid schema: 'maxItems' below 'minItems' at %s", ptr_or_root(path));
    int id = dol_grammar_add_node(g, GN_ARRAY);
    if (id < 0) return oom(c);
    int n_pre = 0, *prefix = NULL;
    if (pre) {
        path_join(p, sizeof p, path, "prefixItems");
        if (!cJSON_IsArray(pre))
            return fail(c, "invalid schema: 'prefixItems' at %s must be an array", p);
        n_pre = cJSON_GetArraySize(pre);
        prefix = malloc(sizeof(int) * (size_t)(n_pre ? n_pre : 1));
        if (!prefix) return oom(c);
        g->nodes[id].prefix = prefix;
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, pre) {
            snprintf(q, sizeof q, "%s/%d", p, i);
            int node = compile(c, x, q);
            if (node < 0) return -1;
            g->nodes[id].prefix[i++] = node;
        }
        g->nodes[id].n_prefix = n_pre;
    }
    int it;
    if (!items || cJSON_IsTrue(items)) {
        it = dol_grammar_any_node(g, &c->any);
        if (it < 0) return oom(c);
    } else if (cJSON_IsFalse(items)) {
        it = GN_NO_ITEMS;
        if (max < 0 || max > n_pre) max = n_pre;
        if (min > max)
            return fail(c, "invalid schema: 'minItems' at %s asks for more items than "
                        "'prefixItems' allows", ptr_or_root(path));
    } else {
        path_join(p, sizeof p, path, "items");
        it = compile(c, items, p);
        if (it < 0) return -1;
    }
    g->nodes[id].items = it;
    g->nodes[id].min_items = min;
    g->nodes[id].max_items = max;
    return id;
}

static int compile_string(cctx *c, const cJSON *s, const char *path)
{
    int min = 0, max = -1, tmpl = 0;
    if (get_count(c, s, "minLength", path, &min)) return -1;
    if (cJSON_GetObjectItemCaseSensitive(s, "maxLength") && get_count(c, s, "maxLength", path, &max))
        return -1;
    if (max >= 0 && max < min)
        return fail(c, "invalid schema: 'maxLength' below 'minLength' at %s", ptr_or_root(path));
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (f) {
        char p[256];
        path_join(p, sizeof p, path, "format");
        if (!cJSON_IsString(f))
            return fail(c, "invalid schema: 'format' at %s must be a string", p);
        if (strcmp(f->valuestring, "uuid") != 0)
            return fail(c, "'format' \"%.40s\" at %s is not supported (only \"uuid\")",
                        f->valuestring, p);
        if (min > 36 || (max >= 0 && max < 36))
            return fail(c, "invalid schema: a uuid is 36 characters; the length bounds at %s "
                        "exclude it", ptr_or_root(path));
        tmpl = GN_TMPL_UUID;
    }
    int id = dol_grammar_add_node(c->g, GN_STRING);
    if (id < 0) return oom(c);
    c->g->nodes[id].min_len = min;
    c->g->nodes[id].max_len = max;
    c->g->nodes[id].tmpl = tmpl;
    return id;
}

#define INT_LIMIT 999999999999999LL   /* integers have at most 15 digits */

static int compile_integer(cctx *c, const cJSON *s, const char *path)
{
    int id = dol_grammar_add_node(c->g, GN_INTEGER);
    if (id < 0) return oom(c);
    gnode *n = &c->g->nodes[id];
    static const char *const keys[] = {"minimum", "maximum"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, keys[i]);
        if (!v) continue;
        char p[256];
        path_join(p, sizeof p, path, keys[i]);
        if (!cJSON_IsNumber(v) || fabs(v->valuedouble) > (double)INT_LIMIT)
            return fail(c, "invalid schema: '%s' at %s must be a number of at most 15 digits",
                        keys[i], p);
        if (i == 0) { n->has_min = true; n->min = (int64_t)ceil(v->valuedouble); }
        else { n->has_max = true; n->max = (int64_t)floor(v->valuedouble); }
    }
    if (n->has_min && n->has_max && n->max < n->min)
        return fail(c, "invalid schema: no integer lies between 'minimum' and 'maximum' at %s",
                    ptr_or_root(path));
    return id;
}

/* An alias node for "#/$defs/name" (or "#" for the root), compiled on
 * first use; recursive references reach the alias while it is compiled. */
static int compile_ref(cctx *c, const cJSON *ref, const char *path)
{
    char p[256];
    path_join(p, sizeof p, path, "$ref");
    if (!cJSON_IsString(ref))
        return fail(c, "invalid schema: '$ref' at %s must be a string", p);
    const char *r = ref->valuestring;
    const cJSON *target = NULL;
    const char *name = r;
    if (strcmp(r, "#") == 0) {
        target = c->root;
    } else {
        const char *pre = strncmp(r, "#/$defs/", 8) == 0 ? "$defs"
                          : strncmp(r, "#/definitions/", 14) == 0 ? "definitions" : NULL;
        if (!pre || strchr(r + strlen(pre) + 3, '/') || strchr(r, '~'))
            return fail(c, "'$ref' \"%.80s\" at %s is not supported (only \"#\", "
                        "\"#/$defs/<name>\" and \"#/definitions/<name>\")", r, p);
        const cJSON *defs = cJSON_GetObjectItemCaseSensitive(c->root, pre);
        target = defs ? cJSON_GetObjectItemCaseSensitive(defs, r + strlen(pre) + 3) : NULL;
        if (!target)
            return fail(c, "invalid schema: '$ref' \"%.80s\" at %s names no definition", r, p);
    }
    for (int i = 0; i < c->n_defs; i++)
        if (strcmp(c->def_name[i], name) == 0) return c->def_node[i];
    if (c->n_defs == MAX_DEFS)
        return fail(c, "'$ref' at %s: more than %d definitions are not supported", p, MAX_DEFS);
    int id = dol_grammar_add_node(c->g, GN_ALIAS);
    if (id < 0) return oom(c);
    c->def_name[c->n_defs] = name;
    c->def_node[c->n_defs++] = id;
    char dp[256];
    snprintf(dp, sizeof dp, "%s", strcmp(r, "#") == 0 ? "" : r + 1);
    int t = compile(c, target, dp);
    if (t < 0) return -1;
    c->g->nodes[id].target = t;
    return id;
}

/* allOf: the branches merged into one schema (a new cJSON the caller frees),
 * or NULL with an error when two branches set one keyword differently. */
static cJSON *merge_all_of(cctx *c, const cJSON *s, const cJSON *all, const char *path)
{
    char p[256];
    path_join(p, sizeof p, path, "allOf");
    if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) == 0) {
        fail(c, "invalid schema: 'allOf' at %s must be a non-empty array", p);
        return NULL;
    }
    cJSON *m = cJSON_Duplicate(s, true);
    if (!m) { oom(c); return NULL; }
    cJSON_DeleteItemFromObjectCaseSensitive(m, "allOf");
    const cJSON *b;
    int i = 0;
    cJSON_ArrayForEach(b, all) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(b, "$ref");
        if (cJSON_IsString(ref) && cJSON_GetArraySize(b) == 1) {
            const char *r = ref->valuestring;
            const cJSON *defs = strncmp(r, "#/$defs/", 8) == 0
                                    ? cJSON_GetObjectItemCaseSensitive(c->root, "$defs") : NULL;
            b = defs ? cJSON_GetObjectItemCaseSensitive(defs, r + 8) : NULL;
            if (!b) {
                fail(c, "'allOf' at %s/%d: only a \"#/$defs/<name>\" $ref can be merged", p, i);
                goto bad;
            }
        }
        if (!cJSON_IsObject(b)) {
            fail(c, "'allOf' at %s/%d: only schema objects can be merged", p, i);
            goto bad;
        }
        const cJSON *k;
        cJSON_ArrayForEach(k, b) {
            cJSON *have = cJSON_GetObjectItemCaseSensitive(m, k->string);
            if (!have) {
                cJSON *d = cJSON_Duplicate(k, true);
                if (!d || !cJSON_AddItemToObject(m, k->string, d)) { cJSON_Delete(d); oom(c); goto bad; }
            } else if (strcmp(k->string, "required") == 0 && cJSON_IsArray(have) &&
                       cJSON_IsArray(k)) {
                const cJSON *x;
                cJSON_ArrayForEach(x, k) {
                    cJSON *d = cJSON_Duplicate(x, true);
                    if (!d || !cJSON_AddItemToArray(have, d)) { cJSON_Delete(d); oom(c); goto bad; }
                }
            } else if (strcmp(k->string, "properties") == 0 && cJSON_IsObject(have) &&
                       cJSON_IsObject(k)) {
                const cJSON *x;
                cJSON_ArrayForEach(x, k) {
                    if (cJSON_GetObjectItemCaseSensitive(have, x->string)) {
                        fail(c, "'allOf' at %s: property '%.64s' is declared by two branches; "
                             "they cannot be merged", p, x->string);
                        goto bad;
                    }
                    cJSON *d = cJSON_Duplicate(x, true);
                    if (!d || !cJSON_AddItemToObject(have, x->string, d)) { cJSON_Delete(d); oom(c); goto bad; }
                }
            } else if (!cJSON_Compare(have, k, true) && !is_annotation(k->string)) {
                fail(c, "'allOf' at %s: '%s' differs between branches; it cannot be merged",
                     p, k->string);
                goto bad;
            }
        }
        i++;
    }
    /* additionalProperties speaks of its own schema's properties only: the
     * merge keeps its meaning when that schema declares every property */
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(m, "properties");
    for (int k = -1; k < cJSON_GetArraySize(all); k++) {
        const cJSON *part = k < 0 ? s : cJSON_GetArrayItem(all, k);
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(part, "additionalProperties");
        if (!ap || cJSON_IsTrue(ap)) continue;
        const cJSON *own = cJSON_GetObjectItemCaseSensitive(part, "properties"), *x;
        bool covers = true;
        if (mp) cJSON_ArrayForEach(x, mp)
            covers &= own && cJSON_GetObjectItemCaseSensitive(own, x->string) != NULL;
        if (!covers) {
            fail(c, "'allOf' at %s: 'additionalProperties' in a schema that does not declare "
                 "every merged property cannot be merged", p);
            goto bad;
        }
    }
    return m;
bad:
    cJSON_Delete(m);
    return NULL;
}

/* The JSON types a node can produce (integer counts as number). */
static int node_types(const dol_grammar *g, int id, int depth)
{
    if (id < 0 || depth > 32) return T_ALL;
    const gnode *n = &g->nodes[id];
    switch (n->kind) {
    case GN_ALIAS: return node_types(g, n->target, depth + 1);
    case GN_ANYOF: {
        int t = 0;
        for (int i = 0; i < n->n_alts; i++) t |= node_types(g, n->alts[i], depth + 1);
        return t;
    }
    case GN_OBJECT: return T_OBJECT;
    case GN_ARRAY: return T_ARRAY;
    case GN_STRING: return T_STRING;
    case GN_INTEGER: case GN_NUMBER: return T_NUMBER;
    default: {
        int t = 0;
        for (int i = 0; i < n->n_lit; i++) {
            char ch = g->lits[n->lit_first + i][0];
            t |= ch == '"' ? T_STRING : ch == '{' ? T_OBJECT : ch == '[' ? T_ARRAY
                 : ch == 't' || ch == 'f' ? T_BOOLEAN : ch == 'n' ? T_NULL : T_NUMBER;
        }
        return t;
    }
    }
}

static const gnode *resolve(const dol_grammar *g, int id)
{
    for (int k = 0; k < 32 && id >= 0 && g->nodes[id].kind == GN_ALIAS; k++) id = g->nodes[id].target;
    return id >= 0 ? &g->nodes[id] : NULL;
}

/* Two oneOf branches no value can match both: different JSON types, or
 * closed objects each requiring a property the other does not declare, or
 * literal sets without a common member. */
static bool disjoint(const dol_grammar *g, int a, int b)
{
    if (!(node_types(g, a, 0) & node_types(g, b, 0))) return true;
    const gnode *x = resolve(g, a), *y = resolve(g, b);
    if (!x || !y) return false;
    if (x->kind == GN_OBJECT && y->kind == GN_OBJECT && x->additional < 0 && y->additional < 0) {
        for (int pass = 0; pass < 2; pass++) {
            const gnode *u = pass ? y : x, *v = pass ? x : y;
            bool found = false;
            for (int i = 0; i < u->n_props && !found; i++) {
                if (!(u->required >> i & 1)) continue;
                /* the key text of property i of u */
                const char *key = NULL;
                for (int j = 0; j < u->n_props; j++)
                    if (u->key_prop[j] == i) key = g->lits[u->key_first + j];
                bool declared = false;
                for (int j = 0; j < v->n_props && key; j++)
                    declared |= strcmp(g->lits[v->key_first + j], key) == 0;
                found = key && !declared;
            }
            if (!found) return false;
        }
        return true;
    }
    if (x->kind == GN_LITERAL && y->kind == GN_LITERAL) {
        for (int i = 0; i < x->n_lit; i++)
            for (int j = 0; j < y->n_lit; j++)
                if (strcmp(g->lits[x->lit_first + i], g->lits[y->lit_first + j]) == 0) return false;
        return true;
    }
    return false;
}

static int compile_alts(cctx *c, const cJSON *arr, const char *kw, const char *path)
{
    char p[256], q[300];
    path_join(p, sizeof p, path, kw);
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n == 0)
        return fail(c, "invalid schema: '%s' at %s must be a non-empty array", kw, p);
    int id = dol_grammar_add_node(c->g, GN_ANYOF);
    if (id < 0) return oom(c);
    int *alts = malloc(sizeof(int) * (size_t)n);
    if (!alts) return oom(c);
    c->g->nodes[id].alts = alts;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        snprintf(q, sizeof q, "%s/%d", p, i);
        int a = compile(c, x, q);
        if (a < 0) return -1;
        c->g->nodes[id].alts[i++] = a;
    }
    c->g->nodes[id].n_alts = n;
    if (strcmp(kw, "oneOf") == 0)
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++)
                if (!disjoint(c->g, c->g->nodes[id].alts[a], c->g->nodes[id].alts[b]))
                    return fail(c, "'oneOf' at %s: branches %d and %d may both match one "
                                "value; only disjoint branches are supported (use anyOf)",
                                p, a, b);
    return id;
}

static int compile_body(cctx *c, const cJSON *s, const char *path)
{
    if (cJSON_IsTrue(s)) {
        int a = dol_grammar_any_node(c->g, &c->any);
        return a < 0 ? oom(c) : a;
    }
    if (!cJSON_IsObject(s))
        return fail(c, "invalid schema: the schema at %s must be an object or true",
                    ptr_or_root(path));
    const cJSON *k;
    char p[256];
    int kwtypes = 0, n_constraining = 0;
    cJSON_ArrayForEach(k, s) {
        if (!is_supported(k->string)) {
            path_join(p, sizeof p, path, k->string);
            return fail(c, "'%.64s' at %s is not supported (see docs/api.md, "
                        "Structured output)", k->string, p);
        }
        kwtypes |= keyword_types(k->string);
        if (!is_annotation(k->string)) n_constraining++;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (all) {
        cJSON *m = merge_all_of(c, s, all, path);
        if (!m) return -1;
        int id = compile(c, m, path);
        cJSON_Delete(m);
        return id;
    }
    const char *combo = ref ? "$ref" : any ? "anyOf" : one ? "oneOf" : NULL;
    if (combo) {
        if (n_constraining > 1) {
            path_join(p, sizeof p, path, combo);
            return fail(c, "'%s' at %s together with other keywords is not supported (wrap "
                        "them in allOf)", combo, p);
        }
        return ref ? compile_ref(c, ref, path) : compile_alts(c, any ? any : one, combo, path);
    }
    int types = T_ALL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (t) {
        if (parse_types(c, t, path, &types)) return -1;
        int stray = kwtypes & ~types & ~(types & T_NUMBER ? 0 : 0);
        if ((kwtypes & T_INTEGER) && !(types & T_INTEGER)) stray |= T_INTEGER;
        if (stray) {
            const char *kw = "";
            cJSON_ArrayForEach(k, s) if (keyword_types(k->string) & stray) { kw = k->string; break; }
            path_join(p, sizeof p, path, kw);
            return fail(c, "'%s' at %s does not apply to the schema's 'type'", kw, p);
        }
    } else if (kwtypes) {
        types = kwtypes;   /* keywords of one kind: values of that kind */
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || co) {
        if (kwtypes) {
            const char *kw = "";
            cJSON_ArrayForEach(k, s) if (keyword_types(k->string)) { kw = k->string; break; }
            path_join(p, sizeof p, path, kw);
            return fail(c, "'%s' at %s together with enum/const is not supported", kw, p);
        }
        if (en && co) {
            path_join(p, sizeof p, path, "const");
            return fail(c, "'const' at %s together with 'enum' is not supported", p);
        }
        return compile_literals(c, co ? co : en, co != NULL, types, path);
    }
    if ((types & T_INTEGER) && (types & T_NUMBER) && (kwtypes & T_INTEGER)) {
        path_join(p, sizeof p, path, "minimum");
        return fail(c, "'minimum'/'maximum' at %s are supported on integers only", p);
    }
    if (types == T_ALL && !kwtypes) {
        int a = dol_grammar_any_node(c->g, &c->any);
        return a < 0 ? oom(c) : a;
    }
    int ids[7], n = 0;
    if (types & T_OBJECT) ids[n++] = compile_object(c, s, path);
    if (n && ids[n - 1] < 0) return -1;
    if (types & T_ARRAY) ids[n++] = compile_array(c, s, path);
    if (n && ids[n - 1] < 0) return -1;
    if (types & T_STRING) ids[n++] = compile_string(c, s, path);
    if (n && ids[n - 1] < 0) return -1;
    if (types & T_NUMBER) ids[n++] = dol_grammar_add_node(c->g, GN_NUMBER);
    else if (types & T_INTEGER) ids[n++] = compile_integer(c, s, path);
    if (n && ids[n - 1] < 0) return c->failed ? -1 : oom(c);
    if (types & (T_BOOLEAN | T_NULL)) {
        const char *w[3];
        int nw = 0;
        if (types & T_BOOLEAN) { w[nw++] = "true"; w[nw++] = "false"; }
        if (types & T_NULL) w[nw++] = "null";
        ids[n++] = literal_node(c->g, w, nw);
        if (ids[n - 1] < 0) return oom(c);
    }
    if (n == 1) return ids[0];
    int id = dol_grammar_add_node(c->g, GN_ANYOF);
    int *alts = malloc(sizeof(int) * (size_t)n);
    if (id < 0 || !alts) { free(alts); return oom(c); }
    memcpy(alts, ids, sizeof(int) * (size_t)n);
    c->g->nodes[id].alts = alts;
    c->g->nodes[id].n_alts = n;
    return id;
}

static int compile(cctx *c, const cJSON *s, const char *path)
{
    if (c->failed) return -1;
    if (++c->depth > MAX_COMPILE_DEPTH) {
        c->depth--;
        return fail(c, "the schema at %s nests more than %d levels deep", ptr_or_root(path),
                    MAX_COMPILE_DEPTH);
    }
    int id = compile_body(c, s, path);
    c->depth--;
    if (id >= 0 && id >= c->cap_npath) {   /* remember where node id came from */
        int cap = c->g->cap_nodes > id ? c->g->cap_nodes : id + 1;
        char **np = realloc(c->npath, sizeof *np * (size_t)cap);
        if (!np) return oom(c);
        memset(np + c->cap_npath, 0, sizeof *np * (size_t)(cap - c->cap_npath));
        c->npath = np;
        c->cap_npath = cap;
    }
    if (id >= 0 && !c->npath[id] && !(c->npath[id] = strdup(path))) return oom(c);
    if (id >= 0 && c->g->n_states > c->max_states)
        return fail(c, "the schema's automaton would have more than %d states "
                    "(max_grammar_states)", c->max_states);
    return id;
}

/* Every alias must reach a non-alias node ({"$ref":"#"} alone would not). */
static int check_aliases(cctx *c)
{
    for (int i = 0; i < c->g->n_nodes; i++) {
        int id = i, k = 0;
        while (id >= 0 && c->g->nodes[id].kind == GN_ALIAS && k++ <= c->g->n_nodes)
            id = c->g->nodes[id].target;
        if (id < 0 || k > c->g->n_nodes)
            return fail(c, "invalid schema: a '$ref' refers only to itself");
    }
    return 0;
}

/* Every value must be finite: refuse a schema whose root has no finite
 * value (dol_grammar_heights), naming the requirement that closes the
 * endless chain; and one whose shallowest value nests too deep to match. */
static int check_finite(cctx *c)
{
    dol_grammar *g = c->g;
    dol_grammar_heights(g);
    int h = g->nodes[g->root].height;
    if (h < GN_NO_VALUE) {
        if (h > GN_MAX_DEPTH - 1)
            return fail(c, "invalid schema: its values nest more than %d levels deep",
                        GN_MAX_DEPTH - 1);
        return 0;
    }
    bool *seen = calloc((size_t)g->n_nodes, sizeof *seen);
    if (!seen) return oom(c);
    const char *kw = "$ref", *at = "";
    int id = g->root;
    while (id >= 0 && !seen[id]) {
        seen[id] = true;
        const gnode *n = &g->nodes[id];
        const char *p = id < c->cap_npath && c->npath[id] ? c->npath[id] : NULL;
        int next = -1;
        if (n->kind == GN_ALIAS) {
            next = n->target;
            if (p) { kw = "$ref"; at = p; }
        } else if (n->kind == GN_ANYOF) {
            next = n->n_alts ? n->alts[0] : -1;   /* every branch is endless */
        } else if (n->kind == GN_OBJECT) {
            for (int i = 0; i < n->n_props && next < 0; i++)
                if ((n->required >> i & 1) &&
                    (n->prop_node[i] < 0 || g->nodes[n->prop_node[i]].height >= GN_NO_VALUE))
                    next = n->prop_node[i];
            kw = "required";
            at = p ? p : "";
        } else if (n->kind == GN_ARRAY) {
            for (int i = 0; i < n->min_items && next < 0; i++) {
                int it = i < n->n_prefix ? n->prefix[i] : n->items;
                if (it < 0 || g->nodes[it].height >= GN_NO_VALUE) next = it;
            }
            kw = "minItems";
            at = p ? p : "";
        }
        id = next;
    }
    free(seen);
    char ptr[300];
    path_join(ptr, sizeof ptr, at, kw);
    return fail(c, "invalid schema: '%s' at %s can only be met by a value nested without "
                "end; the schema admits no finite value", kw, ptr);
}

/* ---- the cache of compiled schemas ----------------------------------------- */

#define SCHEMA_CACHE 32
static struct { char *text; int max_states; dol_grammar *g; } g_cache[SCHEMA_CACHE];
static int g_cache_next;

int dol_grammar_from_schema(const char *schema, size_t len, int max_states,
                            dol_grammar **out, char *msg, size_t msglen, bool *is_oom)
{
    *out = NULL;
    *is_oom = false;
    if (max_states <= 0) max_states = DOL_GRAMMAR_MAX_STATES;
    pthread_mutex_lock(&g_cache_mu);
    for (int i = 0; i < SCHEMA_CACHE; i++)
        if (g_cache[i].g && g_cache[i].max_states == max_states &&
            strlen(g_cache[i].text) == len && memcmp(g_cache[i].text, schema, len) == 0) {
            *out = g_cache[i].g;
            dol_grammar_retain(*out);
            pthread_mutex_unlock(&g_cache_mu);
            return 0;
        }
    pthread_mutex_unlock(&g_cache_mu);

    cJSON *root = cJSON_ParseWithLength(schema, len);
    if (!root) {
        snprintf(msg, msglen, "invalid schema: not JSON");
        return -1;
    }
    cctx c = {.root = root, .max_states = max_states, .msg = msg, .msglen = msglen, .any = -1};
    c.g = dol_grammar_alloc();
    if (!c.g) { cJSON_Delete(root); *is_oom = true; snprintf(msg, msglen, "out of memory"); return -1; }
    /* the root is an alias of itself, so that "#" can refer to it */
    c.def_name[0] = "#";
    c.def_node[0] = dol_grammar_add_node(c.g, GN_ALIAS);
    c.n_defs = 1;
    int body = c.def_node[0] < 0 ? oom(&c) : compile(&c, root, "");
    if (body >= 0) {
        c.g->nodes[c.def_node[0]].target = body;
        c.g->root = c.def_node[0];
        if (check_aliases(&c) == 0) check_finite(&c);
    }
    for (int i = 0; i < c.cap_npath; i++) free(c.npath[i]);
    free(c.npath);
    cJSON_Delete(root);
    if (c.failed) {
        *is_oom = c.oom;
        dol_grammar_release(c.g);
        return -1;
    }
    char *text = malloc(len + 1);
    if (text) {
        memcpy(text, schema, len);
        text[len] = '\0';
        pthread_mutex_lock(&g_cache_mu);
        int i = g_cache_next;
        g_cache_next = (g_cache_next + 1) % SCHEMA_CACHE;
        free(g_cache[i].text);
        if (g_cache[i].g) dol_grammar_release(g_cache[i].g);
        g_cache[i].text = text;
        g_cache[i].max_states = max_states;
        g_cache[i].g = c.g;
        dol_grammar_retain(c.g);
        pthread_mutex_unlock(&g_cache_mu);
    }
    *out = c.g;
    return 0;
}

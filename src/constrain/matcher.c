/* src/constrain/matcher.c — the automaton that runs a grammar over bytes, the
 * vocabulary trie, and the token masks (docs/api.md, "Structured output").
 *
 * A matcher's state is a small set of stacks (more than one while anyOf
 * branches or type arrays are undecided). A stack is an immutable linked
 * list of frames, so that stepping by one byte makes at most a few new
 * frames and shares the rest: a mask walks the vocabulary trie depth first,
 * stepping each live prefix by its next byte, and drops whole subtrees at
 * once when no stack survives.
 *
 * Masks are cached per top frame: the walk starts from the top frame alone
 * over a sentinel parent; tokens that stay inside the top frame are decided
 * there and then, and where the top frame ends inside a token the walk
 * records a resume point (trie node, final frame, the byte to hand on). A
 * mask is then the cached bits plus the resume points continued with the
 * real parents, which only ever admit a few bytes (",", "}", whitespace). */
#include "constrain/grammar_priv.h"

#include <stdlib.h>
#include <string.h>

#define MAXS 32          /* stacks in one state */
#define MAX_DEPTH GN_MAX_DEPTH /* frames in one stack */
#define WS_MAX 2         /* whitespace bytes in a row between tokens */
#define ARENA 16384      /* frames of scratch for one walk or token */
#define CACHE_SLOTS 4096
#define CACHE_MAX 2048   /* entries before the cache is emptied */
#define ADDL (-1)        /* key result: an additional property */

enum { FK_ROOT, FK_OBJECT, FK_KEY, FK_ARRAY, FK_STRING, FK_INTEGER, FK_NUMBER, FK_LITERAL };

typedef struct frame {
    const struct frame *parent;
    int64_t v;          /* object, key: seen properties; integer: |value| */
    int32_t node;
    int32_t a, b;       /* per kind, see step() */
    uint16_t aux;
    uint16_t depth;
    uint8_t fk, phase, ws, flags;
} frame;

static const frame SENT;   /* the unknown parent of a cached walk */

typedef struct {
    int32_t node;       /* trie node reached when the top frame ended */
    int16_t refeed;     /* the byte its parent must take, or -1 */
    frame popped;       /* the top frame as it ended */
} resume;

typedef struct {
    const dol_grammar *g;
    frame *arena;
    int top, cap;
    const frame **out;  /* resulting stacks of one step */
    int n_out;
    resume *res;        /* sentinel pops of one step (cached walks only) */
    int n_res, cap_res;
} sctx;

/* ---- frames -------------------------------------------------------------------- */

static frame *fnew(sctx *s, const frame *from)
{
    if (s->top >= s->cap) return NULL;
    frame *f = &s->arena[s->top++];
    *f = *from;
    return f;
}

static void emit(sctx *s, const frame *f)
{
    if (f && s->n_out < MAXS) s->out[s->n_out++] = f;
}

static bool is_ws(int c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_hex(int c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static void step(sctx *s, const frame *f, int c);

/* One more whitespace byte in f's gap, if the bound allows. */
static void step_ws(sctx *s, const frame *f)
{
    if (f->ws >= WS_MAX) return;
    frame *n = fnew(s, f);
    if (n) { n->ws++; emit(s, n); }
}

/* The parent of a finished child, told of it. */
static const frame *done(sctx *s, const frame *parent, const frame *child)
{
    frame *p = fnew(s, parent);
    if (!p) return NULL;
    p->ws = 0;
    switch (p->fk) {
    case FK_ROOT: p->phase = 2; break;
    case FK_ARRAY: {
        /* count only as far as the bounds look (the count is part of the cache key) */
        const gnode *n = &s->g->nodes[p->node];
        int cap = n->max_items >= 0 ? n->max_items : n->min_items > n->n_prefix ? n->min_items : n->n_prefix;
        if (p->a < cap) p->a++;
        p->phase = 3;
        break;
    }
    case FK_OBJECT:
        if (p->phase == 2) {   /* the key */
            p->aux = (uint16_t)(child->a == ADDL ? 0xFFFF : child->a);
            if (child->a != ADDL) p->v |= (int64_t)(1ull << child->a);
            p->phase = 3;
        } else {
            p->phase = 6;
        }
        break;
    default: return NULL;
    }
    return p;
}

/* f has ended; refeed >= 0 is a byte it did not take, for its parent. */
static void pop(sctx *s, const frame *f, int refeed)
{
    if (f->parent == &SENT) {
        if (s->n_res >= s->cap_res) return;
        resume *r = &s->res[s->n_res++];
        r->refeed = (int16_t)refeed;
        r->popped = *f;
        r->popped.parent = NULL;
        return;
    }
    const frame *p = done(s, f->parent, f);
    if (!p) return;
    if (refeed >= 0) step(s, p, refeed);
    else emit(s, p);
}

static const gnode *gn(const sctx *s, int id) { return &s->g->nodes[id]; }

/* Can a value of node id, pushed over a frame at depth `depth`, still be
 * completed within MAX_DEPTH? Near the bound this keeps only the values
 * that can close in time, so a live stack always has a completion. */
static bool fits(const sctx *s, int depth, int id)
{
    return id >= 0 && depth + s->g->nodes[id].height <= MAX_DEPTH - 1;
}

/* Push a value of node `id` over parent (already in its waiting phase) and
 * feed it its first byte c. anyOf pushes every branch. */
static void push_value(sctx *s, const frame *parent, int id, int c, int guard)
{
    while (id >= 0 && gn(s, id)->kind == GN_ALIAS && guard++ < 64) id = gn(s, id)->target;
    if (id < 0 || guard >= 64 || !fits(s, parent->depth, id)) return;
    const gnode *n = gn(s, id);
    if (n->kind == GN_ANYOF) {
        for (int i = 0; i < n->n_alts; i++) push_value(s, parent, n->alts[i], c, guard + 1);
        return;
    }
    frame f = {.parent = parent, .node = id, .depth = (uint16_t)(parent->depth + 1)};
    switch (n->kind) {
    case GN_OBJECT: f.fk = FK_OBJECT; break;
    case GN_ARRAY: f.fk = FK_ARRAY; break;
    case GN_STRING: f.fk = FK_STRING; break;
    case GN_INTEGER: f.fk = FK_INTEGER; break;
    case GN_NUMBER: f.fk = FK_NUMBER; break;
    default: f.fk = FK_LITERAL; f.a = n->lit_first; f.b = n->lit_first + n->n_lit; break;
    }
    step(s, &f, c);   /* f is copied by whatever survives */
}

/* ---- strings ------------------------------------------------------------------- */

/* One byte of a JSON string's content. sub packs the escape state (bits
 * 0-2: 1 after '\\', 2-5 the \u hex digits, 6 the second digit after a
 * 'd', which keeps surrogates out), the UTF-8 continuation bytes still due
 * (bits 3-4) and the range of the next one (bits 5-7). Returns the new sub,
 * -1 when c is not allowed, -2 at the closing quote; *start is set when c
 * begins a character. */
static int str_step(int sub, int c, bool *start)
{
    int esc = sub & 7, rem = (sub >> 3) & 3, cls = sub >> 5;
    *start = false;
    if (rem) {
        static const uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
        static const uint8_t hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
        if (c < lo[cls] || c > hi[cls]) return -1;
        return (rem - 1) << 3;
    }
    switch (esc) {
    case 1:
        if (c == 'u') return 2;
        return strchr("\"\\/bfnrt", c) && c ? 0 : -1;
    case 2: return is_hex(c) ? (c == 'd' || c == 'D' ? 6 : 3) : -1;
    case 6: return c >= '0' && c <= '7' ? 4 : -1;
    case 3: return is_hex(c) ? 4 : -1;
    case 4: return is_hex(c) ? 5 : -1;
    case 5: return is_hex(c) ? 0 : -1;
    default: break;
    }
    if (c == '"') return -2;
    *start = true;
    if (c == '\\') return 1;
    if (c < 0x20) return -1;
    if (c < 0x80) return 0;
    if (c >= 0xC2 && c <= 0xDF) return 1 << 3;
    if (c == 0xE0) return 2 << 3 | 1 << 5;
    if (c == 0xED) return 2 << 3 | 2 << 5;
    if (c >= 0xE1 && c <= 0xEF) return 2 << 3;
    if (c == 0xF0) return 3 << 3 | 3 << 5;
    if (c >= 0xF1 && c <= 0xF3) return 3 << 3;
    if (c == 0xF4) return 3 << 3 | 4 << 5;
    return -1;
}

static bool uuid_ok(int pos, int c)
{
    if (pos == 8 || pos == 13 || pos == 18 || pos == 23) return c == '-';
    return pos < 36 && (is_digit(c) || (c >= 'a' && c <= 'f'));
}

static void step_string(sctx *s, const frame *f, int c)
{
    const gnode *n = gn(s, f->node);
    if (f->phase == 0) {
        if (c != '"') return;
        frame *x = fnew(s, f);
        if (x) { x->phase = 1; emit(s, x); }
        return;
    }
    bool start;
    int sub = str_step(f->aux, c, &start);
    if (sub == -1) return;
    if (sub == -2) {
        if (f->a < n->min_len || (n->tmpl && f->a != 36)) return;
        pop(s, f, -1);
        return;
    }
    if (start) {
        if (n->max_len >= 0 && f->a >= n->max_len) return;
        if (n->tmpl && !uuid_ok(f->a, c)) return;
    }
    frame *x = fnew(s, f);
    if (!x) return;
    x->aux = (uint16_t)sub;
    /* count only as far as a bound looks (the count is part of the cache key) */
    if (start && (n->max_len >= 0 || n->tmpl || f->a < n->min_len)) x->a++;
    emit(s, x);
}

/* A key: a JSON string matched against the sorted key texts lits[a, b) at
 * byte aux; phase holds the string state. When it closes, a becomes the
 * property it names, or ADDL. */
static void step_key(sctx *s, const frame *f, int c)
{
    const dol_grammar *g = s->g;
    const gnode *n = gn(s, f->node);
    bool start;
    int sub = str_step(f->phase, c, &start);
    if (sub == -1) return;
    int pos = f->aux, lo = f->b, hi = f->b;
    for (int j = f->a; j < f->b; j++)
        if (g->lit_len[j] > pos && (uint8_t)g->lits[j][pos] == c) {
            if (lo == f->b) lo = j;
            hi = j + 1;
        }
    if (sub == -2) {
        int prop = ADDL;
        for (int j = lo; j < hi; j++)
            if (g->lit_len[j] == pos + 1) prop = n->key_prop[j - n->key_first];
        if (prop != ADDL && (f->v >> prop & 1)) return;   /* a key twice */
        if (!fits(s, f->depth - 1, prop == ADDL ? n->additional : n->prop_node[prop])) return;
        frame *x = fnew(s, f);
        if (!x) return;
        x->a = prop;
        pop(s, x, -1);
        return;
    }
    bool live = fits(s, f->depth - 1, n->additional);
    for (int j = lo; j < hi && !live; j++) {
        int prop = n->key_prop[j - n->key_first];
        live = !(f->v >> prop & 1) && fits(s, f->depth - 1, n->prop_node[prop]);
    }
    if (!live) return;
    frame *x = fnew(s, f);
    if (!x) return;
    x->phase = (uint8_t)sub;
    x->a = lo;
    x->b = lo < hi ? hi : lo;
    if (lo < hi) x->aux = (uint16_t)(pos + 1);
    emit(s, x);
}

/* ---- containers ---------------------------------------------------------------- */

/* Another key can follow in object frame f: one not yet seen whose value
 * fits under the depth bound, or an additional property. */
static bool key_possible(const sctx *s, const gnode *n, const frame *f)
{
    if (f->depth + 1 >= MAX_DEPTH) return false;
    if (fits(s, f->depth, n->additional)) return true;
    for (int i = 0; i < n->n_props; i++)
        if (!((uint64_t)f->v >> i & 1) && fits(s, f->depth, n->prop_node[i])) return true;
    return false;
}

/* Object phases: 0 before '{', 1 after '{', 2 in a key, 3 before ':',
 * 4 before a value, 5 in a value, 6 after a value, 7 after ','. */
static void step_object(sctx *s, const frame *f, int c)
{
    const gnode *n = gn(s, f->node);
    bool closable = (n->required & ~(uint64_t)f->v) == 0;
    frame *x;
    switch (f->phase) {
    case 0:
        if (c == '{' && (x = fnew(s, f))) { x->phase = 1; emit(s, x); }
        return;
    case 1:
    case 7:
        if (is_ws(c)) { step_ws(s, f); return; }
        if (c == '}' && f->phase == 1 && closable) { pop(s, f, -1); return; }
        if (c == '"' && key_possible(s, n, f) && (x = fnew(s, f))) {
            x->phase = 2;
            x->ws = 0;
            frame k = {.parent = x, .node = f->node, .fk = FK_KEY, .v = f->v,
                       .a = n->key_first, .b = n->key_first + n->n_props,
                       .depth = (uint16_t)(f->depth + 1)};
            emit(s, fnew(s, &k));
        }
        return;
    case 3:
        if (is_ws(c)) { step_ws(s, f); return; }
        if (c == ':' && (x = fnew(s, f))) { x->phase = 4; x->ws = 0; emit(s, x); }
        return;
    case 4: {
        if (is_ws(c)) { step_ws(s, f); return; }
        int node = f->aux == 0xFFFF ? n->additional : n->prop_node[f->aux];
        if ((x = fnew(s, f))) { x->phase = 5; x->ws = 0; push_value(s, x, node, c, 0); }
        return;
    }
    case 6:
        if (is_ws(c)) { step_ws(s, f); return; }
        if (c == '}' && closable) { pop(s, f, -1); return; }
        if (c == ',' && key_possible(s, n, f) && (x = fnew(s, f))) { x->phase = 7; x->ws = 0; emit(s, x); }
        return;
    default: return;
    }
}

static int item_node(const gnode *n, int i)
{
    if (n->max_items >= 0 && i >= n->max_items) return -1;
    return i < n->n_prefix ? n->prefix[i] : n->items;
}

/* Array phases: 0 before '[', 1 after '[', 2 in an item, 3 after an item,
 * 4 after ','. a counts the items. */
static void step_array(sctx *s, const frame *f, int c)
{
    const gnode *n = gn(s, f->node);
    frame *x;
    switch (f->phase) {
    case 0:
        if (c == '[' && (x = fnew(s, f))) { x->phase = 1; emit(s, x); }
        return;
    case 1:
    case 4: {
        if (is_ws(c)) { step_ws(s, f); return; }
        if (c == ']' && f->phase == 1 && n->min_items == 0) { pop(s, f, -1); return; }
        int item = item_node(n, f->a);
        if (item >= 0 && (x = fnew(s, f))) { x->phase = 2; x->ws = 0; push_value(s, x, item, c, 0); }
        return;
    }
    case 3:
        if (is_ws(c)) { step_ws(s, f); return; }
        if (c == ']' && f->a >= n->min_items) { pop(s, f, -1); return; }
        if (c == ',' && fits(s, f->depth, item_node(n, f->a)) && (x = fnew(s, f))) {
            x->phase = 4;
            x->ws = 0;
            emit(s, x);
        }
        return;
    default: return;
    }
}

/* ---- scalars ------------------------------------------------------------------- */

#define MAX_INT_DIGITS 15

static int64_t pow10i(int k)
{
    int64_t p = 1;
    while (k-- > 0) p *= 10;
    return p;
}

/* Can an integer that so far reads sign `neg`, nd digits worth v still end
 * inside [min, max]? */
static bool int_feasible(const gnode *n, bool neg, int64_t v, int nd)
{
    for (int k = nd ? 0 : 1; nd + k <= MAX_INT_DIGITS; k++) {
        int64_t lo, hi;
        if (nd == 0) { lo = k == 1 ? (neg ? 1 : 0) : pow10i(k - 1); hi = pow10i(k) - 1; }
        else if (v == 0) { if (k > 0) break; lo = hi = 0; }
        else { lo = v * pow10i(k); hi = lo + pow10i(k) - 1; }
        int64_t slo = neg ? -hi : lo, shi = neg ? -lo : hi;
        if ((!n->has_min || shi >= n->min) && (!n->has_max || slo <= n->max)) return true;
    }
    return false;
}

static bool int_complete(const gnode *n, const frame *f)
{
    if (f->phase < 2) return false;
    int64_t x = (f->flags & 1) ? -f->v : f->v;
    return (!n->has_min || x >= n->min) && (!n->has_max || x <= n->max);
}

/* Integer phases: 0 start, 1 after '-', 2 after a lone '0', 3 in digits. */
static void step_integer(sctx *s, const frame *f, int c)
{
    const gnode *n = gn(s, f->node);
    bool neg = f->flags & 1;
    frame *x;
    if (f->phase == 2 || (f->phase == 3 && !is_digit(c))) {
        if (int_complete(n, f)) pop(s, f, c);
        return;
    }
    if (f->phase == 0 && c == '-') {
        if (int_feasible(n, true, 0, 0) && (x = fnew(s, f))) { x->phase = 1; x->flags = 1; emit(s, x); }
        return;
    }
    if (!is_digit(c) || f->a >= MAX_INT_DIGITS) return;
    int d = c - '0';
    if (f->phase <= 1 && d == 0) {
        if (neg || !int_feasible(n, false, 0, 1)) return;   /* no "-0" */
        if ((x = fnew(s, f))) { x->phase = 2; x->a = 1; x->v = 0; emit(s, x); }
        return;
    }
    /* the value is tracked only when bounded (it is part of the cache key) */
    int64_t v = n->has_min || n->has_max ? f->v * 10 + d : 0;
    if (!int_feasible(n, neg, v ? v : d, f->a + 1)) return;
    if ((x = fnew(s, f))) { x->phase = 3; x->a++; x->v = v; emit(s, x); }
}

/* Number phases: 0 start, 1 after '-', 2 after a lone '0', 3 integer
 * digits, 4 after '.', 5 fraction digits, 6 after 'e', 7 after its sign,
 * 8 exponent digits. a counts the digits of the current part. */
static void step_number(sctx *s, const frame *f, int c)
{
    static const int max_digits[9] = {0, 0, 0, MAX_INT_DIGITS, 0, MAX_INT_DIGITS, 0, 0, 2};
    int ph = f->phase, next = -1;
    bool digit = is_digit(c);
    switch (ph) {
    case 0: next = c == '-' ? 1 : c == '0' ? 2 : digit ? 3 : -1; break;
    case 1: next = c == '0' ? 2 : digit ? 3 : -1; break;
    case 2: case 3: case 5:
        if (c == '.' && ph != 5) next = 4;
        else if (c == 'e' || c == 'E') next = 6;
        else if (digit && ph != 2) next = f->a < max_digits[ph] ? ph : -1;
        else if (!digit) { pop(s, f, c); return; }
        break;
    case 4: next = digit ? 5 : -1; break;
    case 6: next = c == '+' || c == '-' ? 7 : digit ? 8 : -1; break;
    case 7: next = digit ? 8 : -1; break;
    case 8:
        if (!digit) { pop(s, f, c); return; }
        next = f->a < max_digits[8] ? 8 : -1;
        break;
    }
    if (next < 0) return;
    frame *x = fnew(s, f);
    if (!x) return;
    x->a = next == ph ? f->a + 1 : (next == 3 || next == 5 || next == 8 ? 1 : 0);
    x->phase = (uint8_t)next;
    emit(s, x);
}

static bool number_complete(const frame *f)
{
    return f->phase == 2 || f->phase == 3 || f->phase == 5 || f->phase == 8;
}

/* A literal: the candidates lits[a, b) agree on their first aux bytes. */
static bool literal_complete(const sctx *s, const frame *f)
{
    return f->aux > 0 && f->a < f->b && s->g->lit_len[f->a] == f->aux;
}

static void step_literal(sctx *s, const frame *f, int c)
{
    const dol_grammar *g = s->g;
    int pos = f->aux, lo = -1, hi = -1;
    for (int j = f->a; j < f->b; j++)
        if (g->lit_len[j] > pos && (uint8_t)g->lits[j][pos] == c) {
            if (lo < 0) lo = j;
            hi = j + 1;
        }
    if (lo >= 0) {
        frame *x = fnew(s, f);
        if (x) { x->a = lo; x->b = hi; x->aux = (uint16_t)(pos + 1); emit(s, x); }
    } else if (literal_complete(s, f)) {
        pop(s, f, c);
    }
}

/* ---- one byte -------------------------------------------------------------------- */

/* Root phases: 0 before the value (no leading whitespace), 1 in it, 2 done. */
static void step(sctx *s, const frame *f, int c)
{
    switch (f->fk) {
    case FK_ROOT:
        if (f->phase == 0) {
            frame *x = fnew(s, f);
            if (x) { x->phase = 1; push_value(s, x, s->g->root, c, 0); }
        }
        return;
    case FK_OBJECT: step_object(s, f, c); return;
    case FK_KEY: step_key(s, f, c); return;
    case FK_ARRAY: step_array(s, f, c); return;
    case FK_STRING: step_string(s, f, c); return;
    case FK_INTEGER: step_integer(s, f, c); return;
    case FK_NUMBER: step_number(s, f, c); return;
    default: step_literal(s, f, c); return;
    }
}

/* A scalar on top that could end here. */
static bool frame_complete(const sctx *s, const frame *f)
{
    switch (f->fk) {
    case FK_INTEGER: return int_complete(gn(s, f->node), f);
    case FK_NUMBER: return number_complete(f);
    case FK_LITERAL: return literal_complete(s, f);
    default: return false;
    }
}

static bool stack_complete(const sctx *s, const frame *f)
{
    if (f->fk == FK_ROOT) return f->phase == 2;
    return frame_complete(s, f) && f->parent && f->parent->fk == FK_ROOT;
}

/* ---- the vocabulary trie ---------------------------------------------------------- */

typedef struct { int32_t child, sibling, tok; uint8_t byte; } tnode;

typedef struct {
    uint32_t uid;
    int32_t node, a, b;
    int64_t v;
    uint16_t aux, depthk;
    uint8_t fk, phase, ws, flags;
} ckey;

typedef struct {
    bool used;
    ckey key;
    uint64_t *bits;
    resume *res;
    int n_res;
} centry;

struct dol_grammar_vocab {
    int vocab, words, eos;
    int max_tok;             /* the longest token, in bytes */
    tnode *t;
    int n_t, cap_t;
    int32_t *tok_next;       /* next id ending at the same trie node */
    int32_t *tok_off, *tok_len; /* bytes of each id in `bytes`; len 0 = never allowed */
    uint8_t *bytes;
    frame *arena;
    resume *res;             /* one step's sentinel pops */
    resume *walk_res;        /* a cached walk's resume points */
    int n_walk_res, cap_walk_res;
    centry *cache;
    int cache_n;
};

static int trie_child(dol_grammar_vocab *v, int node, uint8_t b)
{
    for (int c = v->t[node].child; c >= 0; c = v->t[c].sibling)
        if (v->t[c].byte == b) return c;
    if (v->n_t == v->cap_t) {
        int cap = v->cap_t * 2;
        tnode *t = realloc(v->t, sizeof *t * (size_t)cap);
        if (!t) return -1;
        v->t = t;
        v->cap_t = cap;
    }
    int c = v->n_t++;
    v->t[c] = (tnode){.child = -1, .sibling = v->t[node].child, .tok = -1, .byte = b};
    v->t[node].child = c;
    return c;
}

dol_grammar_vocab *dol_grammar_vocab_new(const dol_tokenizer *tok, int vocab)
{
    dol_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->vocab = vocab;
    v->words = (vocab + 63) / 64;
    v->eos = dol_tokenizer_eos_id(tok);
    v->cap_t = 4096;
    v->t = malloc(sizeof *v->t * (size_t)v->cap_t);
    v->tok_next = malloc(sizeof(int32_t) * (size_t)vocab);
    v->tok_off = calloc((size_t)vocab, sizeof(int32_t));
    v->tok_len = calloc((size_t)vocab, sizeof(int32_t));
    v->arena = malloc(sizeof(frame) * ARENA);
    v->res = malloc(sizeof(resume) * MAXS * 4);
    v->cache = calloc(CACHE_SLOTS, sizeof *v->cache);
    size_t cap_b = 1 << 16, n_b = 0;
    v->bytes = malloc(cap_b);
    if (!v->t || !v->tok_next || !v->tok_off || !v->tok_len || !v->arena || !v->res ||
        !v->cache || !v->bytes)
        goto fail;
    v->t[0] = (tnode){.child = -1, .sibling = -1, .tok = -1};
    v->n_t = 1;
    int32_t unk = dol_tokenizer_piece_to_id(tok, "<unk>");
    for (int id = 0; id < vocab; id++) {
        v->tok_next[id] = -1;
        const char *piece = dol_tokenizer_id_to_piece(tok, id);
        if (!piece || id == unk || dol_tokenizer_is_control(tok, id)) continue;
        uint8_t buf[256];
        size_t n = 0;
        if (dol_tokenizer_is_byte(tok, id)) {
            buf[n++] = (uint8_t)strtol(piece + 3, NULL, 16);
        } else {
            for (const char *p = piece; *p && n < sizeof buf; ) {
                if ((uint8_t)p[0] == 0xE2 && (uint8_t)p[1] == 0x96 && (uint8_t)p[2] == 0x81) {
                    buf[n++] = ' ';
                    p += 3;
                } else {
                    buf[n++] = (uint8_t)*p++;
                }
            }
        }
        if (n == 0) continue;
        if (n_b + n > cap_b) {
            while (n_b + n > cap_b) cap_b *= 2;
            uint8_t *b = realloc(v->bytes, cap_b);
            if (!b) goto fail;
            v->bytes = b;
        }
        memcpy(v->bytes + n_b, buf, n);
        v->tok_off[id] = (int32_t)n_b;
        v->tok_len[id] = (int32_t)n;
        if ((int)n > v->max_tok) v->max_tok = (int)n;
        n_b += n;
        int node = 0;
        for (size_t i = 0; i < n && node >= 0; i++) node = trie_child(v, node, buf[i]);
        if (node < 0) goto fail;
        v->tok_next[id] = v->t[node].tok;
        v->t[node].tok = id;
    }
    return v;
fail:
    dol_grammar_vocab_free(v);
    return NULL;
}

static void cache_clear(dol_grammar_vocab *v)
{
    for (int i = 0; i < CACHE_SLOTS; i++) {
        free(v->cache[i].bits);
        free(v->cache[i].res);
        memset(&v->cache[i], 0, sizeof v->cache[i]);
    }
    v->cache_n = 0;
}

void dol_grammar_vocab_free(dol_grammar_vocab *v)
{
    if (!v) return;
    if (v->cache) cache_clear(v);
    free(v->cache);
    free(v->t);
    free(v->tok_next);
    free(v->tok_off);
    free(v->tok_len);
    free(v->bytes);
    free(v->arena);
    free(v->res);
    free(v->walk_res);
    free(v);
}

int dol_grammar_mask_words(const dol_grammar_vocab *v) { return v->words; }

static void set_tokens(const dol_grammar_vocab *v, int node, uint64_t *bits)
{
    for (int id = v->t[node].tok; id >= 0; id = v->tok_next[id])
        bits[id >> 6] |= 1ull << (id & 63);
}

/* Record the sentinel pops of the last step as resume points at `node`. */
static void keep_resumes(dol_grammar_vocab *v, sctx *s, int node)
{
    for (int i = 0; i < s->n_res; i++) {
        resume *r = &s->res[i];
        bool dup = false;
        for (int j = v->n_walk_res - 1; j >= 0 && v->walk_res[j].node == node && !dup; j--)
            dup = v->walk_res[j].refeed == r->refeed &&
                  memcmp(&v->walk_res[j].popped, &r->popped, sizeof r->popped) == 0;
        if (dup) continue;
        if (v->n_walk_res == v->cap_walk_res) {
            int cap = v->cap_walk_res ? v->cap_walk_res * 2 : 256;
            resume *n = realloc(v->walk_res, sizeof *n * (size_t)cap);
            if (!n) continue;   /* out of memory: the token stays masked */
            v->walk_res = n;
            v->cap_walk_res = cap;
        }
        v->walk_res[v->n_walk_res] = *r;
        v->walk_res[v->n_walk_res++].node = node;
    }
}

/* Depth-first over the children of trie node `node`, the stacks `st`
 * having read the bytes down to it: every token whose bytes some stack
 * survives gets its bit. With `cached`, sentinel pops become resume points. */
static void walk(dol_grammar_vocab *v, sctx *s, int node, const frame *const *st, int n,
                 uint64_t *bits, bool cached)
{
    const frame *next[MAXS];
    for (int ch = v->t[node].child; ch >= 0; ch = v->t[ch].sibling) {
        int mark = s->top;
        s->out = next;
        s->n_out = 0;
        s->n_res = 0;
        for (int i = 0; i < n; i++) step(s, st[i], v->t[ch].byte);
        if (cached && s->n_res) keep_resumes(v, s, ch);
        if (s->n_out > 0) {
            int m = s->n_out;
            set_tokens(v, ch, bits);
            walk(v, s, ch, next, m, bits, cached);
        }
        s->top = mark;
    }
}

static ckey key_of(const dol_grammar_vocab *v, const dol_grammar *g, const frame *f)
{
    ckey k;
    memset(&k, 0, sizeof k);
    k.uid = g->uid;
    k.node = f->node;
    k.a = f->a;
    k.b = f->b;
    k.v = f->v;
    k.aux = f->aux;
    /* depth matters only where a token (one frame a byte at most) could
     * reach a node that no longer fits under MAX_DEPTH */
    k.depthk = f->depth + v->max_tok + g->max_height + 2 >= MAX_DEPTH ? f->depth : 0;
    k.fk = f->fk;
    k.phase = f->phase;
    k.ws = f->ws;
    k.flags = f->flags;
    return k;
}

static uint64_t key_hash(const ckey *k)
{
    const uint8_t *p = (const uint8_t *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void sctx_init(sctx *s, dol_grammar_vocab *v, const dol_grammar *g)
{
    memset(s, 0, sizeof *s);
    s->g = g;
    s->arena = v->arena;
    s->cap = ARENA;
    s->res = v->res;
    s->cap_res = MAXS * 4;
}

/* The cached mask of top frame f: its entry, built on a miss. NULL on OOM. */
static const centry *entry_of(dol_grammar_vocab *v, const dol_grammar *g, const frame *f)
{
    ckey k = key_of(v, g, f);
    uint64_t h = key_hash(&k);
    int slot = (int)(h % CACHE_SLOTS);
    while (v->cache[slot].used) {
        if (memcmp(&v->cache[slot].key, &k, sizeof k) == 0) return &v->cache[slot];
        slot = (slot + 1) % CACHE_SLOTS;
    }
    if (v->cache_n >= CACHE_MAX) {
        cache_clear(v);
        slot = (int)(h % CACHE_SLOTS);
    }
    uint64_t *bits = calloc((size_t)v->words, sizeof *bits);
    if (!bits) return NULL;
    sctx s;
    sctx_init(&s, v, g);
    frame top = *f;
    top.parent = &SENT;
    const frame *st[1] = {&top};
    v->n_walk_res = 0;
    walk(v, &s, 0, st, 1, bits, true);
    resume *res = NULL;
    if (v->n_walk_res) {
        res = malloc(sizeof *res * (size_t)v->n_walk_res);
        if (!res) { free(bits); return NULL; }
        memcpy(res, v->walk_res, sizeof *res * (size_t)v->n_walk_res);
    }
    centry *e = &v->cache[slot];
    e->used = true;
    e->key = k;
    e->bits = bits;
    e->res = res;
    e->n_res = v->n_walk_res;
    v->cache_n++;
    return e;
}

/* ---- the matcher --------------------------------------------------------------- */

struct dol_matcher {
    dol_grammar *g;
    const frame *tops[MAXS];
    int n;
    frame *store[2];        /* the state's frames; ping-pong on each token */
    int store_cap[2], cur;
    frame *scratch;         /* stepping through one token */
};

/* Copy stacks st[0..n) into store `which` (dropping duplicates). */
static bool commit(dol_matcher *m, const frame *const *st, int n)
{
    int which = 1 - m->cur, need = 0;
    for (int i = 0; i < n; i++) need += st[i]->depth + 1;
    if (need > m->store_cap[which]) {
        frame *f = realloc(m->store[which], sizeof *f * (size_t)need);
        if (!f) return false;
        m->store[which] = f;
        m->store_cap[which] = need;
    }
    frame *out = m->store[which];
    int used = 0, k = 0;
    for (int i = 0; i < n; i++) {
        bool dup = false;
        for (int j = 0; j < i && !dup; j++) {
            const frame *a = st[i], *b = st[j];
            while (a && b) {
                frame x = *a, y = *b;
                x.parent = y.parent = NULL;
                if (memcmp(&x, &y, sizeof x) != 0) break;
                a = a->parent;
                b = b->parent;
            }
            dup = !a && !b;
        }
        if (dup) continue;
        int base = used;
        for (const frame *f = st[i]; f; f = f->parent) out[used++] = *f;
        for (int j = base; j < used; j++) out[j].parent = j + 1 < used ? &out[j + 1] : NULL;
        m->tops[k++] = &out[base];
    }
    m->n = k;
    m->cur = which;
    return true;
}

dol_matcher *dol_matcher_new(dol_grammar *g)
{
    dol_matcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->scratch = malloc(sizeof(frame) * ARENA);
    if (!m->scratch) { free(m); return NULL; }
    dol_grammar_retain(g);
    m->g = g;
    frame root = {.fk = FK_ROOT};
    const frame *st[1] = {&root};
    if (!commit(m, st, 1)) { dol_matcher_free(m); return NULL; }
    return m;
}

void dol_matcher_free(dol_matcher *m)
{
    if (!m) return;
    dol_grammar_release(m->g);
    free(m->store[0]);
    free(m->store[1]);
    free(m->scratch);
    free(m);
}

bool dol_matcher_accept_bytes(dol_matcher *m, const char *bytes, size_t n)
{
    const frame *a[MAXS], *b[MAXS];
    const frame **cur = a, **next = b;
    int nc = m->n;
    memcpy(a, m->tops, sizeof(frame *) * (size_t)nc);
    sctx s = {.g = m->g, .arena = m->scratch, .cap = ARENA};
    resume dummy[1];
    s.res = dummy;
    for (size_t i = 0; i < n; i++) {
        s.out = next;
        s.n_out = 0;
        for (int k = 0; k < nc; k++) step(&s, cur[k], (uint8_t)bytes[i]);
        if (s.n_out == 0) return false;
        nc = s.n_out;
        const frame **t = cur; cur = next; next = t;
    }
    return commit(m, cur, nc);
}

bool dol_matcher_accept(dol_matcher *m, const dol_grammar_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->vocab || v->tok_len[id] == 0) return false;
    return dol_matcher_accept_bytes(m, (const char *)v->bytes + v->tok_off[id],
                                    (size_t)v->tok_len[id]);
}

bool dol_matcher_complete(const dol_matcher *m)
{
    sctx s = {.g = m->g};
    for (int i = 0; i < m->n; i++)
        if (stack_complete(&s, m->tops[i])) return true;
    return false;
}

void dol_matcher_mask(dol_matcher *m, dol_grammar_vocab *v, uint64_t *mask)
{
    memset(mask, 0, sizeof *mask * (size_t)v->words);
    for (int i = 0; i < m->n; i++) {
        const frame *top = m->tops[i];
        const centry *e = entry_of(v, m->g, top);
        if (!e) continue;   /* out of memory: nothing from this stack */
        for (int w = 0; w < v->words; w++) mask[w] |= e->bits[w];
        if (!top->parent) continue;
        for (int r = 0; r < e->n_res; r++) {
            const resume *rs = &e->res[r];
            const frame *next[MAXS];
            sctx s;
            sctx_init(&s, v, m->g);
            s.out = next;
            const frame *p = done(&s, top->parent, &rs->popped);
            if (!p) continue;
            if (rs->refeed >= 0) step(&s, p, rs->refeed);
            else emit(&s, p);
            int n = s.n_out;
            if (n == 0) continue;
            set_tokens(v, rs->node, mask);
            walk(v, &s, rs->node, next, n, mask, false);
        }
    }
    if (dol_matcher_complete(m) && v->eos >= 0 && v->eos < v->vocab)
        mask[v->eos >> 6] |= 1ull << (v->eos & 63);
}

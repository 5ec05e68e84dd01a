/* src/constrain/grammar_priv.h — the compiled grammar shared by schema.c (JSON
 * Schema -> nodes) and matcher.c (the automaton, the vocabulary trie, the
 * masks). A grammar is a graph of nodes, one per JSON value shape; the
 * matcher's stack frames point at nodes. */
#ifndef DOLPHIN_CONSTRAIN_GRAMMAR_PRIV_H
#define DOLPHIN_CONSTRAIN_GRAMMAR_PRIV_H

#include <stdatomic.h>

#include "dolphin/grammar.h"

enum {
    GN_ALIAS = 0,  /* a $ref: the node `target` */
    GN_ANYOF,      /* any of alts (type arrays, anyOf, oneOf) */
    GN_OBJECT,
    GN_ARRAY,
    GN_STRING,
    GN_INTEGER,
    GN_NUMBER,
    GN_LITERAL,    /* one of lits[lit_first .. +n_lit) (enum, const, true/false/null) */
};

#define GN_MAX_PROPS 64   /* properties of one object (a 64-bit seen mask) */
#define GN_NO_ITEMS (-1)  /* array: no items past prefixItems */
#define GN_TMPL_UUID 1
#define GN_MAX_DEPTH 512  /* frames in one matcher stack, the root's included */
#define GN_NO_VALUE 0x3fffffff /* height of a node no finite value matches */

typedef struct {
    int kind;
    int target;                 /* alias */
    int *alts, n_alts;          /* anyof */
    /* object: property i has value node prop_node[i]; the keys as JSON text
     * without the opening quote ("name\"") are lits[key_first + j], sorted,
     * for property key_prop[j] */
    int n_props, *prop_node, key_first, *key_prop;
    uint64_t required;
    int additional;             /* node of other keys' values; -1 = none */
    /* array */
    int *prefix, n_prefix, items, min_items, max_items; /* max -1 = none */
    /* string: lengths in code points; max -1 = none; tmpl: GN_TMPL_* */
    int min_len, max_len, tmpl;
    /* integer */
    bool has_min, has_max;
    int64_t min, max;
    /* literal */
    int lit_first, n_lit;
    /* the fewest stack frames a complete value needs (this node's own
     * included), GN_NO_VALUE when none: see dol_grammar_heights */
    int height;
} gnode;

struct dol_grammar {
    atomic_int refs;
    uint32_t uid;               /* unique per compiled grammar: the mask cache's key */
    gnode *nodes;
    int n_nodes, cap_nodes;
    char **lits;                /* literal texts, lit_len bytes each */
    int *lit_len;
    int n_lits, cap_lits;
    int root;
    int n_states;
    int max_height;             /* the largest finite node height */
};

/* A new grammar with one reference and a fresh uid; NULL on OOM. */
dol_grammar *dol_grammar_alloc(void);
/* Append a node (zeroed but for kind); its id or -1 on OOM. */
int dol_grammar_add_node(dol_grammar *g, int kind);
/* Append a literal (copied); its index or -1 on OOM. */
int dol_grammar_add_lit(dol_grammar *g, const char *s, size_t n);
/* Sort lits[first .. first+n) (bytewise; a prefix before its extensions),
 * permuting perm alongside when non-NULL. */
void dol_grammar_sort_lits(dol_grammar *g, int first, int n, int *perm);
/* Fill every node's height by a fixpoint (a node has a finite value when
 * some alternative completes with finite children only: each required
 * property, each of the first minItems items, the $ref target, one anyOf
 * branch) and max_height. */
void dol_grammar_heights(dol_grammar *g);
/* The node of any JSON value (added on first use); -1 on OOM. */
int dol_grammar_any_node(dol_grammar *g, int *cache);

#endif

/* Flight Recorder pickles to columns, without a Python object per entry.
 *
 * An accelerator for tracediag/ingest/flight.py, never the only way in. `scan(data, max_entries)` runs
 * the plain-data subset of the pickle machine (protocols 2-5: dicts, lists, tuples, str, bytes, ints up
 * to 64 bits, floats, bools, None, MARK, memo get/put, FRAME) into a small tree of nodes, then writes
 * the fields of the dump's entries into growable columns, and converts only the rest of the top-level
 * dict (pg_config, pg_status, version: a few hundred values) to Python objects. It answers only where
 * the restricted unpickler (safepickle.py) plus flight.py's typing would give the same rows: for any
 * other opcode (GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, PERSID, EXT*, text opcodes, sets, buffers), a
 * truncated or corrupt stream, or an entry field of another type, it returns a short reason string and
 * flight.py reads the file with the restricted unpickler, which gives the one-line error or the counted
 * skips. A pickle that names a callable is never run by either.
 *
 * Bounded: every read is checked against the end of the buffer; the tree has at most one node per
 * opcode; the values written out (list items and string bytes, which shared memo references could
 * multiply) are capped at EXPAND_FACTOR times the pickle's size plus EXPAND_SLACK, past which `scan`
 * raises ValueError (a one-line error: a pickle bomb).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 200
#define EXPAND_FACTOR 8
#define EXPAND_SLACK (1 << 20)

enum { N_NONE, N_BOOL, N_INT, N_FLOAT, N_STR, N_BYTES, N_LIST, N_TUPLE, N_DICT };

typedef struct {
    uint8_t kind;
    uint32_t len;  /* N_STR / N_BYTES: byte length */
    int64_t v;     /* N_BOOL/N_INT: value; N_FLOAT: bits; N_STR/N_BYTES: offset in data; containers: index */
} Node;

typedef struct {
    uint32_t *items; /* dicts: key, value, key, value, ...; set from `at` once the pickle has run */
    uint32_t at, n, cap; /* the items' place in the arena */
} Box;

typedef struct {
    const unsigned char *data;
    Py_ssize_t size;
    Node *nodes;
    uint32_t nn, ncap;
    Box *boxes;
    uint32_t nb, bcap;
    uint32_t *arena; /* every container's items (a box's region moves to the end when it outgrows it) */
    uint32_t na, acap;
    uint64_t *shash; /* per node, its string's hash once computed (0: not yet) */
    int8_t *field_cache; /* per node, the entry field its string names (-2: not looked up yet) */
    PyObject **cache; /* per node, its Python object once made (NULL: not yet) */
    uint32_t hcap, fcap, ccap;
    uint32_t *made; /* the nodes `cache` holds an object for, to release them */
    uint32_t nmade, mdcap;
    uint32_t *stack;
    uint32_t ns, scap;
    uint32_t *marks;
    uint32_t nm, mcap;
    uint32_t *memo; /* node + 1; 0: unset */
    uint32_t memo_cap, memo_len;
    const char *why; /* the reason for declining */
} Machine;

static int grow(void **p, uint32_t *cap, uint32_t need, size_t item) {
    if (need <= *cap) return 0;
    uint64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    if (c > UINT32_MAX) return -1;
    void *q = realloc(*p, (size_t)c * item);
    if (!q) return -1;
    *p = q;
    *cap = (uint32_t)c;
    return 0;
}

static int64_t new_node(Machine *m, uint8_t kind, uint32_t len, int64_t v) {
    if (grow((void **)&m->nodes, &m->ncap, m->nn + 1, sizeof(Node))) return -1;
    m->nodes[m->nn] = (Node){kind, len, v};
    return m->nn++;
}

static int64_t new_box(Machine *m, uint8_t kind) {
    if (grow((void **)&m->boxes, &m->bcap, m->nb + 1, sizeof(Box))) return -1;
    m->boxes[m->nb] = (Box){NULL, 0, 0, 0};
    int64_t node = new_node(m, kind, 0, m->nb);
    if (node >= 0) m->nb++;
    return node;
}

/* Append k items to a box (containers get their items in batches: APPENDS, SETITEMS, TUPLE). */
static int box_extend(Machine *m, uint32_t box, const uint32_t *src, uint32_t k) {
    Box *b = &m->boxes[box];
    if (!k) return 0;
    if ((uint64_t)b->n + k > b->cap) {
        if (b->at + b->cap == m->na && b->cap) { /* the last region: grow it in place */
            uint32_t more = b->n + k - b->cap;
            if (grow((void **)&m->arena, &m->acap, m->na + more, sizeof(uint32_t))) return -1;
            m->na += more;
            b->cap += more;
        } else {
            uint64_t cap = 2 * ((uint64_t)b->n + k);
            if (cap > UINT32_MAX / 2 || grow((void **)&m->arena, &m->acap, m->na + (uint32_t)cap, sizeof(uint32_t)))
                return -1;
            memcpy(m->arena + m->na, m->arena + b->at, sizeof(uint32_t) * b->n);
            b->at = m->na;
            b->cap = (uint32_t)cap;
            m->na += (uint32_t)cap;
        }
    }
    memcpy(m->arena + b->at + b->n, src, sizeof(uint32_t) * k);
    b->n += k;
    return 0;
}

static int push(Machine *m, int64_t node) {
    if (node < 0 || grow((void **)&m->stack, &m->scap, m->ns + 1, sizeof(uint32_t))) return -1;
    m->stack[m->ns++] = (uint32_t)node;
    return 0;
}

static uint32_t fence(Machine *m) { return m->nm ? m->marks[m->nm - 1] : 0; }

static void machine_free(Machine *m) {
    free(m->boxes);
    free(m->arena);
    free(m->shash);
    free(m->field_cache);
    free(m->cache);
    free(m->made);
    free(m->nodes);
    free(m->stack);
    free(m->marks);
    free(m->memo);
}

/* The machine's buffers, kept from one scan to the next (a 2,000-entry dump needs ~15 MB of them): most
 * of a scan's system time was the kernel mapping fresh pages and realloc copying grown arrays. One scan
 * at a time uses them (`busy`; another, e.g. from a finalizer run during the first, allocates its own);
 * buffers over RETAIN_BYTES in all are freed after the scan, so a rare big dump does not stay resident. */
#define RETAIN_BYTES ((size_t)64 << 20)
static Machine SCRATCH;
static int SCRATCH_BUSY;

static size_t machine_bytes(const Machine *m) {
    return (size_t)m->ncap * sizeof(Node) + (size_t)m->bcap * sizeof(Box) + (size_t)m->acap * 4 +
           (size_t)m->hcap * 8 + m->fcap + (size_t)m->ccap * sizeof(PyObject *) + (size_t)m->mdcap * 4 +
           (size_t)m->scap * 4 + (size_t)m->mcap * 4 + (size_t)m->memo_cap * 4;
}

/* A machine with no contents: the kept buffers where free, else none (grown as it runs). */
static int machine_take(Machine *m) {
    *m = (Machine){0};
    if (SCRATCH_BUSY) return 0;
    SCRATCH_BUSY = 1;
    *m = SCRATCH;
    return 1;
}

/* Give the buffers back (or free them: not the kept ones, or too big to keep). */
static void machine_give(Machine *m, int taken) {
    if (taken && machine_bytes(m) <= RETAIN_BYTES) {
        Machine kept = {0};
        kept.nodes = m->nodes, kept.ncap = m->ncap, kept.boxes = m->boxes, kept.bcap = m->bcap;
        kept.arena = m->arena, kept.acap = m->acap, kept.shash = m->shash, kept.hcap = m->hcap;
        kept.field_cache = m->field_cache, kept.fcap = m->fcap, kept.cache = m->cache, kept.ccap = m->ccap;
        kept.made = m->made, kept.mdcap = m->mdcap, kept.stack = m->stack, kept.scap = m->scap;
        kept.marks = m->marks, kept.mcap = m->mcap, kept.memo = m->memo, kept.memo_cap = m->memo_cap;
        SCRATCH = kept;
    } else {
        machine_free(m);
        if (taken) SCRATCH = (Machine){0};
    }
    if (taken) SCRATCH_BUSY = 0;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Strict UTF-8 (no surrogates, no overlongs): what decodes to the same str under every handler. */
static int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        int k;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; }
        else return 0;
        if (i + k >= n) return 0;
        for (int j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
        if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
        i += k + 1;
    }
    return 1;
}

#define NEED(k) do { if (pos + (k) > end) { m->why = "truncated"; return -1; } } while (0)
#define DECLINE(msg) do { m->why = (msg); return -1; } while (0)
#define OOM() do { m->why = "out of memory"; return -1; } while (0)

static int memo_put(Machine *m, uint64_t idx) {
    if (!m->ns) DECLINE("memo put on an empty stack");
    if (idx > (uint64_t)m->size + 1024) DECLINE("memo index past the file's size");
    if (grow((void **)&m->memo, &m->memo_cap, (uint32_t)idx + 1, sizeof(uint32_t))) OOM();
    return 0;
}

/* Run the pickle; the result node, or -1 with m->why set. */
static int64_t run(Machine *m) {
    const unsigned char *pos = m->data, *end = m->data + m->size;
    uint32_t memo_hw = 0; /* slots below are initialised */
    while (1) {
        NEED(1);
        unsigned char op = *pos++;
        switch (op) {
        case 0x80: /* PROTO */
            NEED(1);
            if (*pos > 5) DECLINE("unsupported pickle protocol");
            pos++;
            break;
        case 0x95: /* FRAME */
            NEED(8);
            if (le(pos, 8) > (uint64_t)(end - pos - 8)) DECLINE("truncated");
            pos += 8;
            break;
        case '.': /* STOP */
            if (!m->ns) DECLINE("empty stack at STOP");
            return m->stack[m->ns - 1];
        case '(':
            if (grow((void **)&m->marks, &m->mcap, m->nm + 1, sizeof(uint32_t))) OOM();
            m->marks[m->nm++] = m->ns;
            break;
        case '0': /* POP */
            if (m->ns <= fence(m)) DECLINE("POP at a mark");
            m->ns--;
            break;
        case '1': /* POP_MARK */
            if (!m->nm) DECLINE("no mark");
            m->ns = m->marks[--m->nm];
            break;
        case '2': /* DUP */
            if (m->ns <= fence(m)) DECLINE("stack underflow");
            if (push(m, m->stack[m->ns - 1])) OOM();
            break;
        case 'N':
            if (push(m, new_node(m, N_NONE, 0, 0))) OOM();
            break;
        case 0x88: case 0x89:
            if (push(m, new_node(m, N_BOOL, 0, op == 0x88))) OOM();
            break;
        case 'J':
            NEED(4);
            if (push(m, new_node(m, N_INT, 0, (int32_t)(uint32_t)le(pos, 4)))) OOM();
            pos += 4;
            break;
        case 'K':
            NEED(1);
            if (push(m, new_node(m, N_INT, 0, *pos))) OOM();
            pos += 1;
            break;
        case 'M':
            NEED(2);
            if (push(m, new_node(m, N_INT, 0, (int64_t)le(pos, 2)))) OOM();
            pos += 2;
            break;
        case 0x8a: { /* LONG1 */
            NEED(1);
            int n = *pos++;
            if (n > 8) DECLINE("integer wider than 64 bits");
            NEED(n);
            uint64_t u = le(pos, n);
            if (n && n < 8 && (pos[n - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * n);
            pos += n;
            if (push(m, new_node(m, N_INT, 0, (int64_t)u))) OOM();
            break;
        }
        case 'G': {
            NEED(8);
            uint64_t u = 0;
            for (int i = 0; i < 8; i++) u = (u << 8) | pos[i];
            pos += 8;
            if (push(m, new_node(m, N_FLOAT, 0, (int64_t)u))) OOM();
            break;
        }
        case 'X': case 0x8c: case 0x8d: case 'B': case 'C': case 0x8e: {
            int w = (op == 0x8c || op == 'C') ? 1 : (op == 0x8d || op == 0x8e) ? 8 : 4;
            NEED(w);
            uint64_t n = le(pos, w);
            pos += w;
            if (n > (uint64_t)(end - pos)) DECLINE("truncated");
            if (n > UINT32_MAX) DECLINE("string over 4 GB");
            int is_str = op == 'X' || op == 0x8c || op == 0x8d;
            if (is_str && !utf8_ok(pos, (Py_ssize_t)n)) DECLINE("string not strict UTF-8");
            if (push(m, new_node(m, is_str ? N_STR : N_BYTES, (uint32_t)n, pos - m->data))) OOM();
            pos += n;
            break;
        }
        case '}': case ']': case ')':
            if (push(m, new_box(m, op == '}' ? N_DICT : op == ']' ? N_LIST : N_TUPLE))) OOM();
            break;
        case 0x85: case 0x86: case 0x87: case 't': case 'l': case 'd': {
            uint32_t from;
            if (op == 't' || op == 'l' || op == 'd') {
                if (!m->nm) DECLINE("no mark");
                from = m->marks[--m->nm];
            } else {
                uint32_t k = op - 0x84;
                if (m->ns < fence(m) + k) DECLINE("stack underflow");
                from = m->ns - k;
            }
            if (op == 'd' && (m->ns - from) % 2) DECLINE("odd number of items for a dict");
            int64_t node = new_box(m, op == 'l' ? N_LIST : op == 'd' ? N_DICT : N_TUPLE);
            if (node < 0) OOM();
            for (uint32_t i = from; op == 'd' && i < m->ns; i += 2) {
                uint8_t kk = m->nodes[m->stack[i]].kind;
                if (kk == N_LIST || kk == N_DICT || kk == N_TUPLE) DECLINE("container dict key");
            }
            if (box_extend(m, (uint32_t)m->nodes[node].v, m->stack + from, m->ns - from)) OOM();
            m->ns = from;
            if (push(m, node)) OOM();
            break;
        }
        case 'a': case 'e': case 's': case 'u': {
            uint32_t from, target;
            if (op == 'a' || op == 's') {
                uint32_t k = op == 'a' ? 1 : 2;
                if (m->ns < fence(m) + k + 1) DECLINE("stack underflow");
                from = m->ns - k;
                target = from - 1;
            } else {
                if (!m->nm) DECLINE("no mark");
                from = m->marks[--m->nm];
                if (from == 0 || from <= fence(m)) DECLINE("stack underflow");
                target = from - 1;
            }
            Node *t = &m->nodes[m->stack[target]];
            int is_dict = op == 's' || op == 'u';
            if (t->kind != (is_dict ? N_DICT : N_LIST)) DECLINE("append or setitem on another type");
            if (is_dict && (m->ns - from) % 2) DECLINE("odd number of items for a dict");
            uint32_t box = (uint32_t)t->v;
            for (uint32_t i = from; is_dict && i < m->ns; i += 2) {
                uint8_t kk = m->nodes[m->stack[i]].kind;
                if (kk == N_LIST || kk == N_DICT || kk == N_TUPLE) DECLINE("container dict key");
            }
            if (box_extend(m, box, m->stack + from, m->ns - from)) OOM();
            m->ns = from;
            break;
        }
        case 'q': case 'r': case 0x94: {
            uint64_t idx;
            if (op == 0x94) idx = m->memo_len;
            else {
                int w = op == 'q' ? 1 : 4;
                NEED(w);
                idx = le(pos, w);
                pos += w;
            }
            if (memo_put(m, idx)) return -1;
            while (memo_hw <= idx) m->memo[memo_hw++] = 0;
            if (!m->memo[idx]) m->memo_len++;
            m->memo[idx] = m->stack[m->ns - 1] + 1;
            break;
        }
        case 'h': case 'j': {
            int w = op == 'h' ? 1 : 4;
            NEED(w);
            uint64_t idx = le(pos, w);
            pos += w;
            if (idx >= memo_hw || !m->memo[idx]) DECLINE("memo key not found");
            if (push(m, m->memo[idx] - 1)) OOM();
            break;
        }
        default:
            DECLINE("an opcode outside plain data");
        }
    }
}

/* ---- columns ---- */

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static int buf_add(Buf *b, const void *src, size_t k) {
    if (b->n + k > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + k) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) return -1;
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, src, k);
    b->n += k;
    return 0;
}

enum { C_INT, C_STR, C_BOOL, C_LIST };

typedef struct Col {
    int kind;
    int64_t rows;
    Buf valid; /* one byte per row */
    Buf data;  /* C_INT: int64; C_BOOL: int8; C_STR/C_LIST: int64 offsets (rows + 1) */
    Buf chars; /* C_STR */
    struct Col *child;
} Col;

static Col *col_new(int kind, Col *child) {
    Col *c = calloc(1, sizeof(Col));
    if (!c) return NULL;
    c->kind = kind;
    c->child = child;
    if (kind == C_STR || kind == C_LIST) {
        int64_t zero = 0;
        if (buf_add(&c->data, &zero, 8)) return NULL;
    }
    return c;
}

static void col_free(Col *c) {
    if (!c) return;
    col_free(c->child);
    free(c->valid.p);
    free(c->data.p);
    free(c->chars.p);
    free(c);
}

/* Entry fields, in the order flight.py's _FIELDS lists them (frames apart). */
typedef struct {
    const char *name;
    int kind;     /* C_INT, C_STR, C_BOOL, or a list shape below */
    int shape;    /* 0 scalar; 1 list of str (tuple too for process_group: 2); 3 list of list of int */
} Field;

static const Field FIELDS[] = {
    {"record_id", C_INT, 0}, {"pg_id", C_INT, 0}, {"process_group", C_LIST, 2},
    {"collective_seq_id", C_INT, 0}, {"p2p_seq_id", C_INT, 0}, {"op_id", C_INT, 0},
    {"profiling_name", C_STR, 0}, {"is_p2p", C_BOOL, 0}, {"input_sizes", C_LIST, 3},
    {"input_dtypes", C_LIST, 1}, {"output_sizes", C_LIST, 3}, {"output_dtypes", C_LIST, 1},
    {"state", C_STR, 0}, {"retired", C_BOOL, 0}, {"time_created_ns", C_INT, 0},
    {"time_discovered_started_ns", C_INT, 0}, {"time_discovered_completed_ns", C_INT, 0},
    {"timeout_ms", C_INT, 0}, {"thread_name", C_STR, 0},
};
#define NF ((int)(sizeof(FIELDS) / sizeof(FIELDS[0])))
#define F_FRAMES NF

typedef struct {
    Machine *m;
    Col *cols[NF];
    int64_t budget; /* values and string bytes still allowed out */
} Out;

static int is_key(Machine *m, uint32_t node, const char *name, size_t n) {
    Node *k = &m->nodes[node];
    return k->kind == N_STR && k->len == n && memcmp(m->data + k->v, name, n) == 0;
}

static int spend(Out *o, int64_t k) {
    o->budget -= k;
    return o->budget < 0 ? -1 : 0;
}

static int put_valid(Col *c, int ok) {
    unsigned char v = (unsigned char)ok;
    c->rows++;
    return buf_add(&c->valid, &v, 1);
}

static int put_str(Out *o, Col *c, uint32_t node) {
    Node *s = &o->m->nodes[node];
    if (spend(o, s->len + 1)) return -2;
    if (buf_add(&c->chars, o->m->data + s->v, s->len)) return -1;
    int64_t end = (int64_t)c->chars.n;
    if (buf_add(&c->data, &end, 8)) return -1;
    return put_valid(c, 1);
}

static int put_null(Col *c) {
    int64_t zero = 0;
    if (c->kind == C_STR || c->kind == C_LIST) {
        int64_t last;
        memcpy(&last, c->data.p + c->data.n - 8, 8);
        if (buf_add(&c->data, &last, 8)) return -1;
    } else if (buf_add(&c->data, &zero, c->kind == C_BOOL ? 1 : 8)) return -1;
    return put_valid(c, 0);
}

static int list_end(Col *c) {
    int64_t end = c->child->rows;
    if (buf_add(&c->data, &end, 8)) return -1;
    return put_valid(c, 1);
}

/* Whether `node` has the type the field takes (null always does). */
static int typed(Machine *m, const Field *f, uint32_t node) {
    Node *v = &m->nodes[node];
    if (v->kind == N_NONE) return 1;
    switch (f->shape) {
    case 0:
        return v->kind == (f->kind == C_INT ? N_INT : f->kind == C_STR ? N_STR : N_BOOL);
    case 1: case 2: {
        if (!(v->kind == N_LIST || (f->shape == 2 && v->kind == N_TUPLE))) return 0;
        Box *b = &m->boxes[v->v];
        for (uint32_t i = 0; i < b->n; i++)
            if (m->nodes[b->items[i]].kind != N_STR) return 0;
        return 1;
    }
    default: {
        if (v->kind != N_LIST) return 0;
        Box *b = &m->boxes[v->v];
        for (uint32_t i = 0; i < b->n; i++) {
            Node *x = &m->nodes[b->items[i]];
            if (x->kind != N_LIST) return 0;
            Box *bx = &m->boxes[x->v];
            for (uint32_t j = 0; j < bx->n; j++)
                if (m->nodes[bx->items[j]].kind != N_INT) return 0;
        }
        return 1;
    }
    }
}

static int put_field(Out *o, int fi, uint32_t node) {
    Machine *m = o->m;
    Col *c = o->cols[fi];
    const Field *f = &FIELDS[fi];
    Node *v = &m->nodes[node];
    if (v->kind == N_NONE) return put_null(c);
    int rc;
    switch (f->shape) {
    case 0:
        if (f->kind == C_STR) return put_str(o, c, node);
        if (f->kind == C_BOOL) {
            int8_t b = (int8_t)v->v;
            if (buf_add(&c->data, &b, 1)) return -1;
        } else if (buf_add(&c->data, &v->v, 8)) return -1;
        return put_valid(c, 1);
    case 1: case 2: {
        Box *b = &m->boxes[v->v];
        for (uint32_t i = 0; i < b->n; i++)
            if ((rc = put_str(o, c->child, b->items[i]))) return rc;
        return list_end(c);
    }
    default: {
        Box *b = &m->boxes[v->v];
        Col *inner = c->child, *ints = inner->child;
        for (uint32_t i = 0; i < b->n; i++) {
            Box *bx = &m->boxes[m->nodes[b->items[i]].v];
            if (spend(o, bx->n + 1)) return -2;
            for (uint32_t j = 0; j < bx->n; j++) {
                if (buf_add(&ints->data, &m->nodes[bx->items[j]].v, 8) || put_valid(ints, 1)) return -1;
            }
            if (list_end(inner)) return -1;
        }
        return list_end(c);
    }
    }
}

/* The field a key names (F_FRAMES for frames), or -1; looked up once per key node (keys are memoised). */
static int field_of(Machine *m, uint32_t key) {
    int8_t *c = &m->field_cache[key];
    if (*c != -2) return *c;
    *c = -1;
    if (is_key(m, key, "frames", 6)) *c = F_FRAMES;
    for (int f = 0; f < NF && *c == -1; f++)
        if (is_key(m, key, FIELDS[f].name, strlen(FIELDS[f].name))) *c = (int8_t)f;
    return *c;
}

/* ---- stacks: an entry's frames, deduplicated by value ---- */

static const char *FRAME_KEYS[3] = {"name", "filename", "line"};
static const size_t FRAME_KEY_LEN[3] = {4, 8, 4};

/* Whether `node` is a list of {name: str|None, filename: str|None, line: int|None} in that key order. */
static int frames_ok(Machine *m, uint32_t node) {
    Node *v = &m->nodes[node];
    if (v->kind == N_NONE) return 1;
    if (v->kind != N_LIST) return 0;
    Box *b = &m->boxes[v->v];
    for (uint32_t i = 0; i < b->n; i++) {
        Node *d = &m->nodes[b->items[i]];
        if (d->kind != N_DICT) return 0;
        Box *bd = &m->boxes[d->v];
        if (bd->n != 6) return 0;
        for (int k = 0; k < 3; k++) {
            if (!is_key(m, bd->items[2 * k], FRAME_KEYS[k], FRAME_KEY_LEN[k])) return 0;
            uint8_t kind = m->nodes[bd->items[2 * k + 1]].kind;
            if (kind != N_NONE && kind != (k < 2 ? N_STR : N_INT)) return 0;
        }
    }
    return 1;
}

static uint64_t mix(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

static inline uint64_t mix64(uint64_t h, uint64_t x) {
    h = (h ^ x) * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 29);
}

static uint64_t scalar_hash(Machine *m, uint64_t h, uint32_t node) {
    Node *v = &m->nodes[node];
    h = mix64(h, v->kind);
    if (v->kind == N_STR) {
        if (!m->shash[node]) {
            uint64_t sh = mix(1469598103934665603ULL, m->data + v->v, v->len);
            m->shash[node] = sh ? sh : 1;
        }
        return mix64(h, m->shash[node]);
    }
    return v->kind == N_INT ? mix64(h, (uint64_t)v->v) : h;
}

static int scalar_eq(Machine *m, uint32_t a, uint32_t b) {
    if (a == b) return 1;
    Node *x = &m->nodes[a], *y = &m->nodes[b];
    if (x->kind != y->kind) return 0;
    if (x->kind == N_STR) return x->len == y->len && memcmp(m->data + x->v, m->data + y->v, x->len) == 0;
    return x->kind == N_NONE || x->v == y->v;
}

/* NULL frames (missing or None) are the node UINT32_MAX. */
static uint64_t frames_hash(Machine *m, uint32_t node) {
    uint64_t h = 1469598103934665603ULL;
    if (node == UINT32_MAX || m->nodes[node].kind == N_NONE) return h;
    Box *b = &m->boxes[m->nodes[node].v];
    h = mix64(h, 0x4C);
    for (uint32_t i = 0; i < b->n; i++) {
        Box *bd = &m->boxes[m->nodes[b->items[i]].v];
        for (int k = 0; k < 3; k++) h = scalar_hash(m, h, bd->items[2 * k + 1]);
    }
    return h;
}

static int frames_eq(Machine *m, uint32_t a, uint32_t b) {
    if (a == b) return 1;
    int an = a == UINT32_MAX || m->nodes[a].kind == N_NONE, bn = b == UINT32_MAX || m->nodes[b].kind == N_NONE;
    if (an || bn) return an && bn;
    Box *x = &m->boxes[m->nodes[a].v], *y = &m->boxes[m->nodes[b].v];
    if (x->n != y->n) return 0;
    for (uint32_t i = 0; i < x->n; i++) {
        Box *dx = &m->boxes[m->nodes[x->items[i]].v], *dy = &m->boxes[m->nodes[y->items[i]].v];
        for (int k = 0; k < 3; k++)
            if (!scalar_eq(m, dx->items[2 * k + 1], dy->items[2 * k + 1])) return 0;
    }
    return 1;
}

/* ---- Python objects for the small rest of the dump ---- */

/* Note that `cache[node]` is about to hold an object (released, and the slot cleared, after the scan). */
static int remember(Machine *m, uint32_t node) {
    if (grow((void **)&m->made, &m->mdcap, m->nmade + 1, sizeof(uint32_t))) { PyErr_NoMemory(); return -1; }
    m->made[m->nmade++] = node;
    return 0;
}

static PyObject *to_py(Machine *m, uint32_t node, PyObject **cache, int depth) {
    if (cache[node]) {
        if (cache[node] == Py_Ellipsis) { m->why = "a tuple that contains itself"; return NULL; }
        Py_INCREF(cache[node]);
        return cache[node];
    }
    if (depth > MAX_DEPTH) { m->why = "nested too deeply"; return NULL; }
    Node *v = &m->nodes[node];
    PyObject *out = NULL;
    switch (v->kind) {
    case N_NONE: out = Py_None; Py_INCREF(out); break;
    case N_BOOL: out = v->v ? Py_True : Py_False; Py_INCREF(out); break;
    case N_INT: out = PyLong_FromLongLong(v->v); break;
    case N_FLOAT: { double d; uint64_t u = (uint64_t)v->v; memcpy(&d, &u, 8); out = PyFloat_FromDouble(d); break; }
    case N_STR: out = PyUnicode_DecodeUTF8((const char *)m->data + v->v, v->len, "strict"); break;
    case N_BYTES: out = PyBytes_FromStringAndSize((const char *)m->data + v->v, v->len); break;
    case N_LIST: case N_DICT: {
        Box *b = &m->boxes[v->v];
        out = v->kind == N_LIST ? PyList_New(0) : PyDict_New();
        if (!out) return NULL;
        if (remember(m, node)) { Py_DECREF(out); return NULL; }
        cache[node] = out;
        Py_INCREF(out);
        for (uint32_t i = 0; i < b->n; i += (v->kind == N_LIST ? 1 : 2)) {
            PyObject *x = to_py(m, b->items[i], cache, depth + 1);
            if (!x) { Py_DECREF(out); return NULL; }
            int rc;
            if (v->kind == N_LIST) rc = PyList_Append(out, x);
            else {
                PyObject *y = to_py(m, b->items[i + 1], cache, depth + 1);
                if (!y) { Py_DECREF(x); Py_DECREF(out); return NULL; }
                rc = PyDict_SetItem(out, x, y);
                Py_DECREF(y);
            }
            Py_DECREF(x);
            if (rc) { Py_DECREF(out); return NULL; }
        }
        return out;
    }
    case N_TUPLE: {
        Box *b = &m->boxes[v->v];
        if (remember(m, node)) return NULL;
        cache[node] = Py_Ellipsis;
        out = PyTuple_New(b->n);
        if (!out) return NULL;
        for (uint32_t i = 0; i < b->n; i++) {
            PyObject *x = to_py(m, b->items[i], cache, depth + 1);
            if (!x) { Py_DECREF(out); cache[node] = NULL; return NULL; }
            PyTuple_SET_ITEM(out, i, x);
        }
        break;
    }
    }
    if (!out) return NULL;
    if (v->kind != N_TUPLE && remember(m, node)) { Py_DECREF(out); return NULL; }
    cache[node] = out;
    Py_INCREF(out);
    return out;
}

static PyObject *frames_py(Machine *m, uint32_t node, PyObject **cache) {
    if (node == UINT32_MAX) Py_RETURN_NONE;
    return to_py(m, node, cache, 0);
}

/* ---- the column tuples handed to Python: (kind, rows, validity bitmap, data, chars, child) ---- */

static PyObject *col_py(Col *c) {
    Py_ssize_t nbytes = (Py_ssize_t)((c->rows + 7) / 8);
    PyObject *bits = PyBytes_FromStringAndSize(NULL, nbytes);
    if (!bits) return NULL;
    unsigned char *bp = (unsigned char *)PyBytes_AS_STRING(bits);
    memset(bp, 0, nbytes);
    for (int64_t i = 0; i < c->rows; i++)
        if (c->valid.p[i]) bp[i >> 3] |= (unsigned char)(1u << (i & 7));
    PyObject *child = NULL;
    if (c->child) {
        child = col_py(c->child);
        if (!child) { Py_DECREF(bits); return NULL; }
    } else {
        child = Py_None;
        Py_INCREF(child);
    }
    return Py_BuildValue("(iLNy#y#N)", c->kind, (long long)c->rows, bits, c->data.p ? c->data.p : "",
                         (Py_ssize_t)c->data.n, c->chars.p ? c->chars.p : "", (Py_ssize_t)c->chars.n, child);
}

static PyObject *COLUMNS_NAMES;

/* scan(data, max_entries) -> reason str | (top dict with "entries" set to None, kept, dropped, columns, stack ids
 * (int32 bytes), stacks list). Raises ValueError on a pickle bomb. */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t max_entries;
    if (!PyArg_ParseTuple(args, "y*n", &view, &max_entries)) return NULL;
    Machine mm;
    Machine *m = &mm;
    int taken = machine_take(m);
    m->data = view.buf;
    m->size = view.len;
    Out o = {m, {0}, EXPAND_FACTOR * (int64_t)view.len + EXPAND_SLACK};
    PyObject *result = NULL, *top = NULL, *cols = NULL, *stacks = NULL, *ids_bytes = NULL;
    PyObject **cache = NULL;
    uint32_t *stack_nodes = NULL, *table = NULL;
    int32_t *ids = NULL;
    int64_t root = run(m);
    if (root < 0) goto decline;
    if (m->nodes[root].kind != N_DICT) { m->why = "not a dict"; goto decline; }
    for (uint32_t i = 0; i < m->nb; i++) m->boxes[i].items = m->arena + m->boxes[i].at;
    uint32_t had = m->ccap, nn1 = m->nn ? m->nn : 1;
    if (grow((void **)&m->shash, &m->hcap, nn1, sizeof(uint64_t)) || grow((void **)&m->field_cache, &m->fcap, nn1, 1) ||
        grow((void **)&m->cache, &m->ccap, nn1, sizeof(PyObject *))) {
        PyErr_NoMemory();
        goto fail;
    }
    memset(m->shash, 0, sizeof(uint64_t) * nn1);
    memset(m->field_cache, -2, nn1);
    memset(m->cache + had, 0, sizeof(PyObject *) * (m->ccap - had)); /* the kept part is all NULL already */
    cache = m->cache;
    Box *tb = &m->boxes[m->nodes[root].v];
    int64_t entries_node = -1;
    for (uint32_t i = 0; i < tb->n; i += 2)
        if (is_key(m, tb->items[i], "entries", 7)) entries_node = tb->items[i + 1];
    uint32_t n_all = 0, first = 0;
    Box *eb = NULL;
    if (entries_node >= 0 && m->nodes[entries_node].kind != N_NONE) {
        if (m->nodes[entries_node].kind != N_LIST) { m->why = "entries not a list"; goto decline; }
        eb = &m->boxes[m->nodes[entries_node].v];
        n_all = eb->n;
        for (uint32_t i = 0; i < n_all; i++)
            if (m->nodes[eb->items[i]].kind != N_DICT) { m->why = "an entry not a dict"; goto decline; }
        if ((Py_ssize_t)n_all > max_entries) first = n_all - (uint32_t)max_entries;
    }
    uint32_t kept = n_all - first;
    /* each kept entry: its field nodes, typed, and its frames */
    int32_t *slot = malloc(sizeof(int32_t) * (NF + 1));
    uint32_t *fnodes = malloc(sizeof(uint32_t) * ((size_t)kept * (NF + 1) + 1));
    if (!slot || !fnodes) { free(slot); free(fnodes); PyErr_NoMemory(); goto fail; }
    for (uint32_t e = 0; e < kept; e++) {
        Box *d = &m->boxes[m->nodes[eb->items[first + e]].v];
        uint32_t *row = fnodes + (size_t)e * (NF + 1);
        for (int f = 0; f <= NF; f++) row[f] = UINT32_MAX;
        for (uint32_t i = 0; i < d->n; i += 2) {
            uint32_t key = d->items[i];
            if (m->nodes[key].kind != N_STR) { m->why = "an entry key not a str"; free(slot); free(fnodes); goto decline; }
            int f = field_of(m, key);
            if (f >= 0) row[f] = d->items[i + 1];
        }
        for (int f = 0; f < NF; f++)
            if (row[f] != UINT32_MAX && !typed(m, &FIELDS[f], row[f])) {
                m->why = "an entry field of another type"; free(slot); free(fnodes); goto decline;
            }
        if (row[F_FRAMES] != UINT32_MAX && !frames_ok(m, row[F_FRAMES])) {
            m->why = "frames of another shape"; free(slot); free(fnodes); goto decline;
        }
    }
    free(slot);
    /* columns */
    for (int f = 0; f < NF; f++) {
        const Field *fd = &FIELDS[f];
        Col *c;
        if (fd->shape == 0) c = col_new(fd->kind, NULL);
        else if (fd->shape == 3) {
            Col *ints = col_new(C_INT, NULL);
            Col *inner = ints ? col_new(C_LIST, ints) : NULL;
            c = inner ? col_new(C_LIST, inner) : NULL;
        } else {
            Col *s = col_new(C_STR, NULL);
            c = s ? col_new(C_LIST, s) : NULL;
        }
        if (!c) { free(fnodes); PyErr_NoMemory(); goto fail; }
        o.cols[f] = c;
    }
    for (uint32_t e = 0; e < kept; e++) {
        uint32_t *row = fnodes + (size_t)e * (NF + 1);
        for (int f = 0; f < NF; f++) {
            int rc = row[f] == UINT32_MAX ? put_null(o.cols[f]) : put_field(&o, f, row[f]);
            if (rc == -2) {
                free(fnodes);
                PyErr_Format(PyExc_ValueError,
                             "its shared lists and strings expand to over %lld values (a pickle bomb); not read",
                             (long long)(EXPAND_FACTOR * (int64_t)view.len + EXPAND_SLACK));
                goto fail;
            }
            if (rc) { free(fnodes); PyErr_NoMemory(); goto fail; }
        }
    }
    /* stacks: open-addressing table of distinct frame lists, ids by first appearance */
    ids = malloc(sizeof(int32_t) * (kept + 1));
    stack_nodes = malloc(sizeof(uint32_t) * (kept + 1));
    uint32_t tcap = 64;
    while (tcap < 2 * kept + 2) tcap *= 2;
    table = malloc(sizeof(uint32_t) * tcap);
    uint64_t *hashes = malloc(sizeof(uint64_t) * (kept + 1));
    if (!ids || !stack_nodes || !table || !hashes) { free(hashes); free(fnodes); PyErr_NoMemory(); goto fail; }
    memset(table, 0xFF, sizeof(uint32_t) * tcap);
    uint32_t nstacks = 0, last_node = UINT32_MAX - 1;
    int32_t last_id = -1;
    for (uint32_t e = 0; e < kept; e++) {
        uint32_t fr = fnodes[(size_t)e * (NF + 1) + F_FRAMES];
        if (fr == last_node && last_id >= 0) { ids[e] = last_id; continue; }
        uint64_t h = frames_hash(m, fr);
        uint32_t at = (uint32_t)(h & (tcap - 1));
        int32_t id = -1;
        while (table[at] != UINT32_MAX) {
            uint32_t s = table[at];
            if (hashes[s] == h && frames_eq(m, stack_nodes[s], fr)) { id = (int32_t)s; break; }
            at = (at + 1) & (tcap - 1);
        }
        if (id < 0) {
            id = (int32_t)nstacks;
            stack_nodes[nstacks] = fr;
            hashes[nstacks] = h;
            table[at] = nstacks++;
        }
        ids[e] = id;
        last_node = fr;
        last_id = id;
    }
    free(hashes);
    free(fnodes);
    stacks = PyList_New(nstacks);
    if (!stacks) goto fail;
    for (uint32_t s = 0; s < nstacks; s++) {
        PyObject *x = frames_py(m, stack_nodes[s], cache);
        if (!x) goto py_fail;
        PyList_SET_ITEM(stacks, s, x);
    }
    top = PyDict_New();
    if (!top) goto fail;
    for (uint32_t i = 0; i < tb->n; i += 2) {
        int is_entries = is_key(m, tb->items[i], "entries", 7);
        PyObject *k = to_py(m, tb->items[i], cache, 1);
        PyObject *v = !k ? NULL : is_entries ? Py_NewRef(Py_None) : to_py(m, tb->items[i + 1], cache, 1);
        if (!v) { Py_XDECREF(k); goto py_fail; }
        int rc = PyDict_SetItem(top, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc) goto py_fail;
    }
    cols = PyTuple_New(NF);
    if (!cols) goto fail;
    for (int f = 0; f < NF; f++) {
        PyObject *c = col_py(o.cols[f]);
        if (!c) goto fail;
        PyTuple_SET_ITEM(cols, f, c);
    }
    ids_bytes = PyBytes_FromStringAndSize((const char *)ids, (Py_ssize_t)kept * 4);
    if (!ids_bytes) goto fail;
    result = Py_BuildValue("(NIINNN)", top, kept, first, cols, ids_bytes, stacks);
    top = cols = ids_bytes = stacks = NULL;
    goto done;
py_fail:
    if (PyErr_Occurred()) goto fail;
decline:
    result = PyUnicode_FromString(m->why ? m->why : "declined");
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(top);
    Py_XDECREF(cols);
    Py_XDECREF(stacks);
    Py_XDECREF(ids_bytes);
    for (uint32_t i = 0; cache && i < m->nmade; i++) {
        PyObject *x = cache[m->made[i]];
        cache[m->made[i]] = NULL;
        if (x && x != Py_Ellipsis) Py_DECREF(x);
    }
    for (int f = 0; f < NF; f++) col_free(o.cols[f]);
    free(ids);
    free(stack_nodes);
    free(table);
    machine_give(m, taken);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef METHODS[] = {
    {"scan", scan, METH_VARARGS, "A Flight Recorder pickle's entries as columns, or the reason it is declined."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_frscan", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__frscan(void) {
    PyObject *mod = PyModule_Create(&MODULE);
    if (!mod) return NULL;
    COLUMNS_NAMES = PyTuple_New(NF);
    if (!COLUMNS_NAMES) return NULL;
    for (int f = 0; f < NF; f++) PyTuple_SET_ITEM(COLUMNS_NAMES, f, PyUnicode_FromString(FIELDS[f].name));
    if (PyModule_AddObject(mod, "FIELDS", COLUMNS_NAMES)) return NULL;
    return mod;
}

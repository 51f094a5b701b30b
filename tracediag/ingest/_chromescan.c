/* Chrome-trace JSON to columns in one pass, without a Python object per event.
 *
 * An accelerator for tracediag/ingest/chrome.py, never the only way in: `scan` either returns the
 * columns of a whole document (a file, or one of the pieces chrome.py cuts it into) or a short
 * reason string, and then chrome.py decodes that document with msgspec as before. It accepts a
 * strict subset of what the msgspec path accepts (valid JSON and UTF-8, every event an object whose
 * `ph` is a known phase, the fields tracediag reads of the types it expects, times with at most 3
 * decimals, no duplicate known keys, nesting under MAX_DEPTH), so where it answers, the answer is
 * the msgspec path's; tests/ingest/test_native_scan.py checks that on every fixture and on mutated files.
 *
 * Every value is bounds-checked against the end of the buffer; nothing is written outside the
 * growable column arrays and the string arena.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stddef.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

#define MAX_DEPTH 64
#define NULL_INT INT64_MIN

/* Column order; exported as COLUMNS. */
enum {
    C_PH, C_CAT, C_NAME, C_PID, C_PID_STR, C_TID, C_TS, C_DUR, C_HAS_ARGS,
    C_EXTERNAL_ID, C_CORRELATION,
    C_DEVICE, C_STREAM, C_NBYTES, C_IN_NELEMS, C_OUT_NELEMS, C_GROUP_SIZE, C_PG_ID, C_SEQ,
    C_SRC_RANK, C_DST_RANK, C_DEVICE_ORDINAL,
    C_COLL_NAME, C_DTYPE, C_PG_NAME, C_STEP_NUM, C_HLO_OP, C_HLO_MODULE, C_RUN_ID, C_LABEL, C_LABELS,
    C_INPUT_DIMS_AT, C_INPUT_DIMS_LEN, C_INPUT_TYPE_AT, C_INPUT_TYPE_LEN, C_CONCRETE_AT, C_CONCRETE_LEN,
    C_ORDER,
    NCOLS
};

/* The exported columns (exported as COLUMNS), one per stored column but for the raw args, whose
 * (_AT, _LEN) pair becomes one binary column. Kinds: K_STR a string (stored: an index into the
 * interned strings, -1 null), K_INT int64 (stored: NULL_INT null), K_BOOL, K_RAW binary (stored: the
 * value's place in `raw`, length 0 null), K_CAT a string exported dictionary-encoded (stored as K_STR;
 * the interned strings are the dictionary, so polars makes it Categorical from the few distinct
 * strings, never hashing a row). */
enum { K_STR, K_INT, K_BOOL, K_RAW, K_CAT };
typedef struct {
    const char *name;
    int col;
    int kind;
} OutCol;

static const OutCol OUT_COLS[] = {
    {"ph", C_PH, K_STR}, {"cat", C_CAT, K_CAT}, {"name", C_NAME, K_CAT}, {"pid", C_PID, K_INT},
    {"pid_str", C_PID_STR, K_STR}, {"tid", C_TID, K_INT}, {"ts", C_TS, K_INT}, {"dur", C_DUR, K_INT},
    {"has_args", C_HAS_ARGS, K_BOOL}, {"external_id", C_EXTERNAL_ID, K_INT}, {"correlation", C_CORRELATION, K_INT},
    {"device", C_DEVICE, K_INT}, {"stream", C_STREAM, K_INT}, {"nbytes", C_NBYTES, K_INT},
    {"in_nelems", C_IN_NELEMS, K_INT}, {"out_nelems", C_OUT_NELEMS, K_INT}, {"group_size", C_GROUP_SIZE, K_INT},
    {"pg_id", C_PG_ID, K_INT}, {"seq", C_SEQ, K_INT}, {"src_rank", C_SRC_RANK, K_INT},
    {"dst_rank", C_DST_RANK, K_INT}, {"device_ordinal", C_DEVICE_ORDINAL, K_INT},
    {"coll_name", C_COLL_NAME, K_STR}, {"dtype", C_DTYPE, K_STR}, {"pg_name", C_PG_NAME, K_STR},
    {"step_num", C_STEP_NUM, K_STR}, {"hlo_op", C_HLO_OP, K_STR}, {"hlo_module", C_HLO_MODULE, K_STR},
    {"run_id", C_RUN_ID, K_STR}, {"label", C_LABEL, K_STR}, {"labels", C_LABELS, K_STR},
    {"input_dims", C_INPUT_DIMS_AT, K_RAW}, {"input_type", C_INPUT_TYPE_AT, K_RAW},
    {"concrete_inputs", C_CONCRETE_AT, K_RAW}, {"order", C_ORDER, K_INT},
};
#define N_OUT ((int)(sizeof(OUT_COLS) / sizeof(OUT_COLS[0])))

/* How an args value is read: an integer (A_ANY_INT also from a string, as polars casts one), a
 * string (an integer literal is kept as its text, as str(int) would), or the value's raw JSON text. */
enum { A_INT, A_ANY_INT, A_STR, A_RAW };

typedef struct {
    const char *key;
    int col;
    int how;
} ArgKey;

static const ArgKey ARG_KEYS[] = {
    {"External id", C_EXTERNAL_ID, A_INT},
    {"correlation", C_CORRELATION, A_INT},
    {"device", C_DEVICE, A_ANY_INT},
    {"stream", C_STREAM, A_ANY_INT},
    {"Collective name", C_COLL_NAME, A_STR},
    {"In msg nelems", C_IN_NELEMS, A_ANY_INT},
    {"Out msg nelems", C_OUT_NELEMS, A_ANY_INT},
    {"dtype", C_DTYPE, A_STR},
    {"Group size", C_GROUP_SIZE, A_ANY_INT},
    {"Process Group Name", C_PG_NAME, A_STR},
    {"Process Group ID", C_PG_ID, A_ANY_INT},
    {"Seq", C_SEQ, A_ANY_INT},
    {"Src Rank", C_SRC_RANK, A_ANY_INT},
    {"Dst Rank", C_DST_RANK, A_ANY_INT},
    {"bytes", C_NBYTES, A_ANY_INT},
    {"step_num", C_STEP_NUM, A_STR},
    {"device_ordinal", C_DEVICE_ORDINAL, A_ANY_INT},
    {"hlo_op", C_HLO_OP, A_STR},
    {"hlo_module", C_HLO_MODULE, A_STR},
    {"run_id", C_RUN_ID, A_STR},
    {"name", C_LABEL, A_STR},
    {"labels", C_LABELS, A_STR},
    {"Input Dims", C_INPUT_DIMS_AT, A_RAW},
    {"Input type", C_INPUT_TYPE_AT, A_RAW},
    {"Concrete Inputs", C_CONCRETE_AT, A_RAW},
};
#define N_ARG_KEYS ((int)(sizeof(ARG_KEYS) / sizeof(ARG_KEYS[0])))
#define MAX_KEY_LEN 32
static signed char KEYS_BY_LEN[MAX_KEY_LEN][8]; /* per key length: ARG_KEYS indexes, -1 ended; filled at import */

/* Phases: 0..3 become rows (X, B, E, M); the others are only counted, by reason. */
enum { R_INSTANT, R_COUNTER, R_FLOW, R_ASYNC, R_OBJECT, R_OTHER, N_REASONS };
static const char *REASON_NAMES[N_REASONS] = {"instant", "counter", "flow", "async", "object", "other_phase"};

static int phase_code(const unsigned char *s, Py_ssize_t len) {
    /* >= 0: a row phase; -1 - reason: a counted phase; -100: unknown. */
    if (len != 1) return -100;
    switch (s[0]) {
    case 'X': return 0;
    case 'B': return 1;
    case 'E': return 2;
    case 'M': return 3;
    case 'i': case 'I': case 'R': return -1 - R_INSTANT;
    case 'C': return -1 - R_COUNTER;
    case 's': case 't': case 'f': return -1 - R_FLOW;
    case 'b': case 'n': case 'e': case 'S': case 'T': case 'p': case 'F': return -1 - R_ASYNC;
    case 'N': case 'O': case 'D': case 'P': return -1 - R_OBJECT;
    case 'c': case '(': case ')': case 'V': case 'v': return -1 - R_OTHER;
    default: return -100;
    }
}

/* A value seen in an event, kept as a span until the phase is known. */
enum { V_ABSENT, V_NULL, V_INT, V_STR, V_RAW, V_BAD };

typedef struct {
    int kind;
    int escaped;          /* V_STR: the span holds escapes */
    int quoted;           /* V_STR: a JSON string (not an integer literal kept as text) */
    int64_t i;            /* V_INT */
    const unsigned char *s; /* V_STR: inside the quotes; V_RAW/V_INT text */
    Py_ssize_t len;
} Val;

typedef struct {
    Val ph, name, cat, ts, dur, pid, tid;
    int has_args;
    uint32_t args_set; /* which of `args` were read (the others are not initialised) */
    int bad; /* a field of a type this scanner leaves to the msgspec path */
    Val args[N_ARG_KEYS]; /* only those in args_set are read */
} Event;

/* A member as met at one position of an object (the last two met there: an optional key shifts
 * the members after it): its token (the bytes from the end of the previous value, or the object's
 * '{', to its value: `,\n    "name": `) and what its key names. Producers
 * write an event's keys in the same order event after event, so comparing the bytes at the next
 * member with the token met there last time names most members with a few vector compares, without
 * scanning or looking the key up. A token is only recorded from a key without escapes, so its second
 * quote is the key's end: the same bytes are the same separator and key.
 *
 * When the value that followed was short, its bytes are kept after the token, with what they read
 * as (`"ph": "X"`, `"pid": 3113936`, `"Trace name": "PyTorch Profiler"`, `"Input Dims": [[], []]`):
 * the same bytes again are the same value, read without parsing it. A value's bytes decide how it
 * reads, but for what lies past them: a number must end there (the next byte is no digit, '.' or
 * exponent), and the depth check depends on the depth it sits at, which it cannot reach (below).
 * Times are never kept (reading one sets per-document flags). */
#define MEMO_SLOTS 24
#define TOK_BYTES 64  /* compared at once; the input must have as many bytes left */
#define MEMO_BYTES 56 /* the longest token (with its value) kept: a number's next byte is within TOK_BYTES */
#define MEMBER_DEPTH 4 /* the deepest member kept: of args, in an event, in traceEvents, in the document */
/* a kept value is under MEMO_BYTES long, so nested under MEMO_BYTES / 2 deep: the limit stays out of reach */
#if MEMBER_DEPTH + MEMO_BYTES / 2 >= MAX_DEPTH
#error "a kept value could reach the depth limit"
#endif
typedef struct {
    unsigned char tok[TOK_BYTES]; /* bytes past full_len: whatever followed (masked off) */
    uint64_t key_bits, full_bits; /* bit k set: byte k of tok is part of the key's, the value's token */
    int key_len;                  /* 0: none yet */
    int full_len;                 /* key_len + the value's length; key_len when no value is kept */
    int id;
    unsigned changes;             /* the key came with another value than the kept one, times in a row */
    int number;                   /* the value is a number */
    int val_at;                   /* where val.s lies from the token's start (V_STR, V_RAW) */
    Val val;                      /* what the value read as (kind V_ABSENT: it was skipped) */
} KeyTok;
typedef struct {
    KeyTok at[MEMO_SLOTS][2]; /* the last two members met at each position (an optional key shifts them) */
    unsigned char last[MEMO_SLOTS]; /* which of the two was met last: compared first */
    KeyTok close; /* the bytes that last closed such an object after a member: `\n  }` */
} KeyMemo;

/* Arrays read before (`"Input Dims": [[8, 128], [128]]`, `"Input type": ["float", ""]`: a trace
 * repeats a few hundred of them): an array's bytes decide whether it is valid JSON and where it
 * ends, so bytes at a '[' that repeat a valid array are that array, but for the depth check (kept:
 * it holds at that depth and any less). Direct-mapped by the hash of the 32 bytes from the '[' (the
 * array and what follows it, often the same next key); a slot holds the last array hashed there. */
#define ARRAY_SLOTS 1024
#define ARRAY_BYTES 64 /* compared at once; the input must have as many bytes left */
typedef struct {
    unsigned char bytes[ARRAY_BYTES]; /* the array, then whatever followed (masked off) */
    int len;                          /* under ARRAY_BYTES; 0: none */
    int depth;                        /* st->depth it was read at */
} SeenArray;

typedef struct {
    uint64_t hash;
    Py_ssize_t at, len; /* in the arena */
    Py_ssize_t index;   /* 0: empty slot; else index + 1 */
} Slot;

#define N_TOP 6 /* the top-level keys read (TOP_KEYS) */

typedef struct {
    /* the document being read */
    const unsigned char *base, *p, *end;
    const char *fail; /* why the document is left to the msgspec path */
    int depth;
    Py_ssize_t n_kept;              /* X/B/E rows of the document */
    int64_t first_order;            /* the `order` of the document's first X/B/E row */
    Py_ssize_t last_rows, last_raw; /* n_rows and raw_len before the last accepted document */
    int can_drop;                   /* drop_last() has that document to drop */
    Py_ssize_t last_event_row;      /* the row of the document's last event, -1 when it made none */
    /* columns of every accepted document (malloc'd: `take` hands them to Arrow arrays, which may
     * free them on any thread); an args column is NULL until a row holds a value in it (most hold
     * none in a file: those are never allocated, filled or scanned) */
    int64_t *cols[NCOLS];
    Py_ssize_t n_rows, cap_rows;
    Py_ssize_t filled; /* rows below hold nulls in the args columns, or what `emit` wrote there */
    Py_ssize_t bytes_seen, rows_seen; /* of the documents accepted (kept by `take`): to size reservations */
    Py_ssize_t batch_rows;            /* the caller takes the rows once they reach this many (0: unknown) */
    unsigned char *raw; /* the raw args values, copied (their documents are gone by the end) */
    Py_ssize_t raw_len, raw_cap;
    /* interned strings: their bytes in `arena`, each one's (offset, length) in `spans` */
    Slot *slots;
    Py_ssize_t n_slots;
    unsigned char *arena;
    Py_ssize_t arena_len, arena_cap;
    Py_ssize_t *spans;
    Py_ssize_t n_strings, spans_cap;
    unsigned char *scratch;
    Py_ssize_t scratch_cap;
    /* counts */
    Py_ssize_t n_events;
    Py_ssize_t reasons[N_REASONS];
    Py_ssize_t top_at[N_TOP], top_len[N_TOP];
    int has_events;
    int float_times, exact_times; /* a time read the float64 way; a ts that sends the msgspec path exact */
    int plain;                    /* plain mode: every event is a row (see parse_events) */
    KeyMemo event_keys, args_keys; /* the keys met at each position of the last event and args */
    SeenArray *arrays;               /* ARRAY_SLOTS arrays read before (NULL until the first) */
    int64_t last_code[3];            /* the string codes of the last row's ph, cat and name */
} State;

static const char *TOP_KEYS[N_TOP] = {"baseTimeNanoseconds", "distributedInfo", "deviceProperties", "metadata",
                                      "displayTimeUnit",     "host_name"};

#define FAIL(st, why) do { (st)->fail = (why); return -1; } while (0)

static unsigned char IS_WS[256]; /* filled at import */

static inline int ctz32(uint32_t x) { /* x != 0 */
#if defined(__GNUC__)
    return __builtin_ctz(x);
#else
    int n = 0;
    while (!(x & 1)) { x >>= 1; n++; }
    return n;
#endif
}

static inline void skip_ws(State *st) {
    const unsigned char *p = st->p, *end = st->end;
    if (p < end && *p > ' ') return; /* most often: nothing to skip */
    if (end - p >= 2 && p[0] == ' ' && p[1] > ' ') { st->p = p + 1; return; } /* or one space */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* pretty-printed traces indent with runs of spaces: 8 bytes at a time */
    while (end - p >= 8 && IS_WS[*p]) {
        uint64_t x;
        memcpy(&x, p, 8);
        uint64_t not_space = x ^ UINT64_C(0x2020202020202020);
        if (!not_space) { p += 8; continue; }
        p += __builtin_ctzll(not_space) >> 3; /* the first byte that is not a space */
        if (!IS_WS[*p]) { st->p = p; return; }
        p++; /* a newline, tab or carriage return */
    }
#endif
    while (p < end && IS_WS[*p]) p++;
    st->p = p;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 sequence starting at p (lead byte >= 0x80); its length, or 0 if invalid. */
static inline int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    int n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) { n = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) n = 3;
    else if (c == 0xED) { n = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) n = 3;
    else if (c == 0xF0) { n = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) { n = 4; hi = 0x8F; }
    else return 0;
    if (end - p < n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int k = 2; k < n; k++)
        if (p[k] < 0x80 || p[k] > 0xBF) return 0;
    return n;
}

static unsigned char STRING_STOP[256]; /* bytes a string scan must look at: quote, backslash, < 0x20, >= 0x80 */

/* A string at st->p (on its opening quote); span inside the quotes. */
static int scan_string(State *st, const unsigned char **s, Py_ssize_t *len, int *escaped) {
    const unsigned char *p = st->p + 1, *end = st->end;
    int esc = 0;
    *s = p;
    while (1) {
#if defined(__SSE2__) && defined(__GNUC__)
        /* 16 bytes at a time while none is a quote, a backslash, < 0x20 or >= 0x80 (negative as signed) */
        while (end - p >= 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)p);
            __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('"')),
                                                     _mm_cmpeq_epi8(x, _mm_set1_epi8('\\'))),
                                        _mm_cmplt_epi8(x, _mm_set1_epi8(0x20)));
            int hit = _mm_movemask_epi8(stop);
            if (hit) { p += __builtin_ctz((unsigned)hit); goto stop; }
            p += 16;
        }
#endif
        while (end - p >= 8) { /* 8 bytes at a time while none is a quote, a backslash, < 0x20 or >= 0x80 */
            uint64_t x;
            memcpy(&x, p, 8);
            uint64_t q = x ^ UINT64_C(0x2222222222222222), b = x ^ UINT64_C(0x5C5C5C5C5C5C5C5C);
            uint64_t hit = ((q - UINT64_C(0x0101010101010101)) & ~q) | ((b - UINT64_C(0x0101010101010101)) & ~b)
                           | (x - UINT64_C(0x2020202020202020)) | x;
            hit &= UINT64_C(0x8080808080808080);
            if (hit) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                p += __builtin_ctzll(hit) >> 3; /* the lowest flagged byte is a true hit (borrows only run upward) */
                goto stop;
#endif
                break;
            }
            p += 8;
        }
        while (p < end && !STRING_STOP[*p]) p++;
    stop:
        if (p >= end) FAIL(st, "string runs past the end");
        unsigned char c = *p;
        if (c == '"') break;
        if (c == '\\') {
            esc = 1;
            if (end - p < 2) FAIL(st, "escape runs past the end");
            unsigned char e = p[1];
            if (e == 'u') {
                if (end - p < 6) FAIL(st, "escape runs past the end");
                int v = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hexval(p[k]);
                    if (h < 0) FAIL(st, "bad \\u escape");
                    v = (v << 4) | h;
                }
                if (v >= 0xD800 && v <= 0xDFFF) FAIL(st, "surrogate escape");
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
            } else {
                FAIL(st, "bad escape");
            }
        } else if (c < 0x20) {
            FAIL(st, "control character in a string");
        } else if (c >= 0x80) {
            int n = utf8_len(p, end);
            if (!n) FAIL(st, "invalid UTF-8");
            p += n;
        } else {
            p++;
        }
    }
    *len = p - *s;
    *escaped = esc;
    st->p = p + 1;
    return 0;
}

/* The length of the string whose content starts at p (after its opening quote) when it closes within
 * the next 16 bytes with none of them an escape, a control byte or non-ASCII; -1 otherwise (then
 * `scan_string` reads it). Inline, for the short names and empty strings most events hold. */
static ALWAYS_INLINE int short_string(const unsigned char *p, const unsigned char *end) {
#if defined(__SSE2__) && defined(__GNUC__)
    if (end - p < 16) return -1;
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('"')),
                                             _mm_cmpeq_epi8(x, _mm_set1_epi8('\\'))),
                                _mm_cmplt_epi8(x, _mm_set1_epi8(0x20)));
    int hit = _mm_movemask_epi8(stop);
    if (!hit) return -1;
    int n = __builtin_ctz((unsigned)hit);
    return p[n] == '"' ? n : -1;
#else
    return -1;
#endif
}

#if defined(__SSE2__) && defined(__GNUC__)
/* Bit k set where byte k of the 16 at p equals byte k of the 16 at t. */
static ALWAYS_INLINE uint64_t equal16(const unsigned char *p, const unsigned char *t) {
    __m128i a = _mm_loadu_si128((const __m128i *)p), b = _mm_loadu_si128((const __m128i *)t);
    return (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(a, b));
}

/* Bit k set where byte k at p equals byte k at t, for k below n rounded up to 16 (n <= 64; both have
 * that many bytes readable): 16 bytes a compare, without a branch per byte. */
static ALWAYS_INLINE uint64_t equal_bits(const unsigned char *p, const unsigned char *t, int n) {
    uint64_t same = equal16(p, t);
    if (n > 16) {
        same |= equal16(p + 16, t + 16) << 16;
        if (n > 32) {
            same |= equal16(p + 32, t + 32) << 32;
            if (n > 48) same |= equal16(p + 48, t + 48) << 48;
        }
    }
    return same;
}
#endif

/* Whether the n (< 64) bytes at p are those at t (both have 64 bytes readable). */
static ALWAYS_INLINE int same_bytes(const unsigned char *p, const unsigned char *t, int n) {
#if defined(__SSE2__) && defined(__GNUC__)
    return !(~equal_bits(p, t, n) & ((UINT64_C(1) << n) - 1));
#elif defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t a, b;
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        memcpy(&a, p + k, 8);
        memcpy(&b, t + k, 8);
        if (a != b) return 0;
    }
    if (k == n) return 1;
    memcpy(&a, p + k, 8); /* the last 1-7 bytes, and those after (masked off) */
    memcpy(&b, t + k, 8);
    return !((a ^ b) & ((UINT64_C(1) << (8 * (n - k))) - 1));
#else
    return !memcmp(p, t, (size_t)n);
#endif
}

typedef struct {
    int is_int, neg, has_exp;
    const unsigned char *int_s, *frac_s;
    Py_ssize_t int_n, frac_n;
    uint64_t int_v; /* the integer part's value, when int_n <= 18 (no overflow possible) */
} Number;

/* The end of the run of decimal digits at p: 8 bytes a step where 8 are left (fractions of 6 digits,
 * ids and times of 16), then byte by byte. */
static ALWAYS_INLINE const unsigned char *skip_digits(const unsigned char *p, const unsigned char *end) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (end - p >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        uint64_t t = x - UINT64_C(0x3030303030303030); /* as in digits8 */
        uint64_t not_digit = (t | (t + UINT64_C(0x7676767676767676))) & UINT64_C(0x8080808080808080);
        if (not_digit) return p + (__builtin_ctzll(not_digit) >> 3);
        p += 8;
    }
#endif
    while (p < end && *p >= '0' && *p <= '9') p++;
    return p;
}

/* A number's fraction and exponent after its integer part, at *pp: the fraction's digits (NULL, 0
 * when none) and whether an exponent follows; *pp then after the number, which must not end the
 * document (a truncated piece). */
static ALWAYS_INLINE int number_tail(State *st, const unsigned char **pp, const unsigned char **frac_s,
                                     Py_ssize_t *frac_n, int *has_exp) {
    const unsigned char *p = *pp, *end = st->end;
    *frac_s = NULL;
    *frac_n = 0;
    *has_exp = 0;
    if (p < end && *p == '.') {
        *frac_s = ++p;
        p = skip_digits(p, end);
        *frac_n = p - *frac_s;
        if (!*frac_n) FAIL(st, "bad number");
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const unsigned char *d = p;
        p = skip_digits(p, end);
        if (p == d) FAIL(st, "bad number");
        *has_exp = 1;
    }
    if (p >= end) FAIL(st, "number at the end of the document"); /* a truncated piece */
    *pp = p;
    return 0;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static const uint64_t POW10[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};

/* How many of the 8 bytes at p are decimal digits before the first that is not (0-8), and their
 * value: the bytes tested and added 8 at a time, not one by one. */
static inline int digits8(const unsigned char *p, uint64_t *value) {
    uint64_t x;
    memcpy(&x, p, 8);
    uint64_t t = x - UINT64_C(0x3030303030303030); /* digits become 0-9; below '0' wraps high */
    uint64_t not_digit = (t | (t + UINT64_C(0x7676767676767676))) & UINT64_C(0x8080808080808080);
    /* borrows and carries run upward only: the lowest flagged byte is a true non-digit */
    int k = not_digit ? __builtin_ctzll(not_digit) >> 3 : 8;
    if (!k) { *value = 0; return 0; }
    t <<= 8 * (8 - k); /* the k digits, as the low digits of an 8-digit number with leading zeros */
    t = ((t & UINT64_C(0x0F0F0F0F0F0F0F0F)) * 2561) >> 8;
    t = ((t & UINT64_C(0x00FF00FF00FF00FF)) * 6553601) >> 16;
    *value = ((t & UINT64_C(0x0000FFFF0000FFFF)) * UINT64_C(42949672960001)) >> 32;
    return k;
}
#endif

static int scan_number(State *st, Number *n) {
    const unsigned char *p = st->p, *end = st->end;
    memset(n, 0, sizeof(*n));
    if (p < end && *p == '-') { n->neg = 1; p++; }
    if (p >= end) FAIL(st, "number runs past the end");
    n->int_s = p;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') {
        uint64_t v = 0; /* wraps past 18 digits: unused there */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        while (end - p >= 8) {
            uint64_t d;
            int k = digits8(p, &d);
            v = v * POW10[k] + d;
            p += k;
            if (k < 8) goto whole;
        }
#endif
        while (p < end && *p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    whole:
#endif
        n->int_v = v;
    }
    else FAIL(st, "bad number");
    n->int_n = p - n->int_s;
    n->is_int = 1;
    if (number_tail(st, &p, &n->frac_s, &n->frac_n, &n->has_exp)) return -1;
    if (n->frac_s || n->has_exp) n->is_int = 0;
    st->p = p;
    return 0;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* A positive integer of 1 to 16 digits at p, with no fraction or exponent (ids, times in whole µs):
 * its digit count and value, read 8 digits a step; 0 when the number is anything else (then
 * `scan_number` reads it). p has 17 bytes readable. */
static ALWAYS_INLINE int short_uint(const unsigned char *p, uint64_t *value) {
    if (*p < '1' || *p > '9') return 0;
    uint64_t hi, lo;
    int n = digits8(p, &hi);
    if (n == 8) {
        int k = digits8(p + 8, &lo);
        if (k == 8 && p[16] >= '0' && p[16] <= '9') return 0;
        hi = hi * POW10[k] + lo;
        n += k;
    }
    unsigned char after = p[n];
    if (after == '.' || after == 'e' || after == 'E') return 0;
    *value = hi;
    return n;
}
#endif

/* The integer part as int64 (ok=0 when it does not fit). */
static int64_t digits_value(const unsigned char *s, Py_ssize_t n, int neg, int *ok) {
    uint64_t v = 0;
    *ok = 0;
    if (n > 19) return 0;
    if (n <= 18) { /* below 10**18: no overflow to check */
        for (Py_ssize_t k = 0; k < n; k++) v = v * 10 + (uint64_t)(s[k] - '0');
    } else {
        for (Py_ssize_t k = 0; k < n; k++) {
            uint64_t d = (uint64_t)(s[k] - '0');
            if (v > (UINT64_MAX - d) / 10) return 0;
            v = v * 10 + d;
        }
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX) return 0; /* INT64_MIN is the null marker */
        *ok = 1;
        return -(int64_t)v;
    }
    if (v > (uint64_t)INT64_MAX) return 0;
    *ok = 1;
    return (int64_t)v;
}

/* A number at st->p checked as `scan_number` checks it, its value unread (a skipped value). */
static int skip_number(State *st) {
    const unsigned char *p = st->p, *end = st->end;
    if (p < end && *p == '-') p++;
    if (p >= end) FAIL(st, "number runs past the end");
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') {
        p = skip_digits(p + 1, end);
    }
    else FAIL(st, "bad number");
    const unsigned char *frac_s;
    Py_ssize_t frac_n;
    int has_exp;
    if (number_tail(st, &p, &frac_s, &frac_n, &has_exp)) return -1;
    st->p = p;
    return 0;
}

/* An array of integers, short plain strings and such arrays (`"Input Dims": [[1024, 512], []]`,
 * `"Input type": ["float", ""]`), checked byte by byte by a table of states instead of a call per
 * element. Whatever is not that (a fraction, an escape, non-ASCII, an object, a literal, a byte out
 * of place, the end of the piece) declines: the general path then reads the array from its start
 * and fails on it exactly where the grammar fails. */
enum { FA_NO, FA_OPEN /* at a '[' */, FA_CLOSE /* at a ']' */, FA_OPENED /* after '[' and spaces */,
       FA_NEXT /* after ',' */, FA_AFTER /* after a value */, FA_STR, FA_MINUS, FA_ZERO, FA_INT, FA_STATES };
static unsigned char FAST_ARRAY[FA_STATES][256]; /* the next state per state and byte; filled at import */

static void fast_array_tables(void) {
    for (int c = 0; c < 256; c++) {
        int ws = c == ' ' || c == '\n' || c == '\r' || c == '\t', digit = c >= '0' && c <= '9';
        int after = c == ',' ? FA_NEXT : c == ']' ? FA_CLOSE : ws ? FA_AFTER : FA_NO; /* a value's end */
        int value = c == '[' ? FA_OPEN : c == '"' ? FA_STR : c == '-' ? FA_MINUS : c == '0' ? FA_ZERO
                    : digit ? FA_INT : FA_NO;
        FAST_ARRAY[FA_NO][c] = FA_NO;
        FAST_ARRAY[FA_OPEN][c] = FAST_ARRAY[FA_OPENED][c] = ws ? FA_OPENED : c == ']' ? FA_CLOSE : value;
        FAST_ARRAY[FA_NEXT][c] = ws ? FA_NEXT : value;
        FAST_ARRAY[FA_CLOSE][c] = FAST_ARRAY[FA_AFTER][c] = after;
        FAST_ARRAY[FA_STR][c] = c == '"' ? FA_AFTER : c == '\\' || c < 0x20 || c >= 0x7F ? FA_NO : FA_STR;
        FAST_ARRAY[FA_MINUS][c] = c == '0' ? FA_ZERO : digit ? FA_INT : FA_NO;
        FAST_ARRAY[FA_ZERO][c] = after;
        FAST_ARRAY[FA_INT][c] = digit ? FA_INT : after;
    }
}

/* The array at st->p ('[') skipped: 0, st->p after it; 1 (st->p unchanged) to leave it to
 * `skip_container`. The nesting is counted only on the states of a bracket, not per byte. */
static ALWAYS_INLINE int skip_array_fast(State *st) {
    const unsigned char *p = st->p + 1, *end = st->end;
    int room = MAX_DEPTH - st->depth - 1, depth = 0; /* nesting below this array, as skip_container counts it */
    unsigned state = FA_OPEN;
    if (room < 0) return 1;
    while (p < end) {
        state = FAST_ARRAY[state][*p++];
        if (state > FA_CLOSE) continue;
        if (state == FA_NO) return 1;
        if (state == FA_OPEN) {
            if (++depth > room) return 1;
        } else if (--depth < 0) {
            st->p = p;
            return 0;
        }
    }
    return 1;
}

static int skip_value(State *st);
static int skip_container(State *st, unsigned char close);

/* The 32 bytes at p hashed to a SeenArray slot. */
static inline unsigned array_slot(const unsigned char *p) {
    uint64_t a, b, c, d;
    memcpy(&a, p, 8);
    memcpy(&b, p + 8, 8);
    memcpy(&c, p + 16, 8);
    memcpy(&d, p + 24, 8);
    uint64_t h = a * UINT64_C(0x9E3779B97F4A7C15) + b * UINT64_C(0xC2B2AE3D27D4EB4F) + c * UINT64_C(0x165667B19E3779F9)
                 + d * UINT64_C(0xFF51AFD7ED558CCD);
    return (unsigned)((h ^ (h >> 29)) * UINT64_C(0xC4CEB9FE1A85EC53) >> 54); /* 10 bits: ARRAY_SLOTS */
}

/* The array at st->p ('['): the one its SeenArray slot holds when the bytes repeat it, else read
 * (and kept in that slot when short and read by the fast path). */
static int skip_array(State *st) {
    const unsigned char *p = st->p;
    SeenArray *seen = NULL;
    if (st->end - p >= ARRAY_BYTES && (st->arrays || (st->arrays = calloc(ARRAY_SLOTS, sizeof(SeenArray))))) {
        seen = &st->arrays[array_slot(p)];
        if (seen->len && st->depth <= seen->depth && same_bytes(p, seen->bytes, seen->len)) {
            st->p = p + seen->len;
            return 0;
        }
    }
    if (skip_array_fast(st)) return skip_container(st, ']'); /* the general path: not kept */
    if (seen && st->p - p < ARRAY_BYTES) {
        memcpy(seen->bytes, p, ARRAY_BYTES);
        seen->len = (int)(st->p - p);
        seen->depth = st->depth;
    }
    return 0;
}

static int skip_container(State *st, unsigned char close) {
    if (++st->depth > MAX_DEPTH) FAIL(st, "nested too deeply");
    st->p++;
    skip_ws(st);
    if (st->p < st->end && *st->p == close) { st->p++; st->depth--; return 0; }
    while (1) {
        if (close == '}') {
            const unsigned char *s; Py_ssize_t len; int esc;
            if (st->p >= st->end || *st->p != '"') FAIL(st, "expected a key");
            if (scan_string(st, &s, &len, &esc)) return -1;
            skip_ws(st);
            if (st->p >= st->end || *st->p != ':') FAIL(st, "expected ':'");
            st->p++;
            skip_ws(st);
        }
        if (skip_value(st)) return -1;
        skip_ws(st);
        if (st->p >= st->end) FAIL(st, "container runs past the end");
        if (*st->p == ',') { st->p++; skip_ws(st); continue; }
        if (*st->p == close) { st->p++; st->depth--; return 0; }
        FAIL(st, "expected ',' or a closing bracket");
    }
}

static int match_literal(State *st, const char *lit, Py_ssize_t n) {
    if (st->end - st->p < n || memcmp(st->p, lit, n)) FAIL(st, "bad literal");
    st->p += n;
    if (st->p >= st->end) FAIL(st, "literal at the end of the document");
    return 0;
}

static int skip_value(State *st) {
    if (st->p >= st->end) FAIL(st, "value runs past the end");
    unsigned char c = *st->p;
    const unsigned char *s; Py_ssize_t len; int esc;
    switch (c) {
    case '{': return skip_container(st, '}');
    case '[': return skip_array(st);
    case '"': {
        int n = short_string(st->p + 1, st->end);
        if (n >= 0) { st->p += n + 2; return 0; }
        return scan_string(st, &s, &len, &esc);
    }
    case 't': return match_literal(st, "true", 4);
    case 'f': return match_literal(st, "false", 5);
    case 'n': return match_literal(st, "null", 4);
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return skip_number(st);
        FAIL(st, "bad value");
    }
}

/* An A_ANY_INT field's string, as polars' non-strict cast to Int64 reads it: a decimal integer (an
 * optional sign, digits) is its value, a string with any other character than digits, signs, '.'
 * and 'e' is null; anything else ("1e2", "5.0", "") is left to the msgspec path. */
static void string_as_int(Val *v) {
    const unsigned char *s = v->s, *end = v->s + v->len;
    if (v->escaped) { v->kind = V_BAD; return; }
    for (const unsigned char *p = s; p < end; p++)
        if (!((*p >= '0' && *p <= '9') || *p == '+' || *p == '-' || *p == '.' || *p == 'e' || *p == 'E')) {
            v->kind = V_NULL;
            return;
        }
    int neg = 0, ok = 0;
    if (s < end && (*s == '+' || *s == '-')) { neg = *s == '-'; s++; }
    if (s == end) { v->kind = V_BAD; return; }
    for (const unsigned char *p = s; p < end; p++)
        if (*p < '0' || *p > '9') { v->kind = V_BAD; return; }
    while (end - s > 1 && *s == '0') s++; /* leading zeros */
    v->i = digits_value(s, end - s, neg, &ok);
    v->kind = ok ? V_INT : V_BAD;
}

/* A value read into a Val: strings and integers (wanted by `how`), null, or raw text. */
static int read_val(State *st, Val *v, int how) {
    if (v->kind != V_ABSENT) FAIL(st, "duplicate key");
    const unsigned char *start = st->p;
    if (st->p >= st->end) FAIL(st, "value runs past the end");
    unsigned char c = *st->p;
    if (how == A_RAW) {
        if (skip_value(st)) return -1;
        v->kind = V_RAW;
        v->s = start;
        v->len = st->p - start;
        return 0;
    }
    if (c == '"') {
        int n = short_string(st->p + 1, st->end);
        if (n >= 0) {
            v->s = st->p + 1;
            v->len = n;
            v->escaped = 0;
            st->p += n + 2;
        } else if (scan_string(st, &v->s, &v->len, &v->escaped)) {
            return -1;
        }
        v->kind = V_STR; /* an A_INT field decides what a string means */
        v->quoted = 1;
        if (how == A_ANY_INT) string_as_int(v);
        return 0;
    }
    if (c == 'n') {
        if (match_literal(st, "null", 4)) return -1;
        v->kind = V_NULL;
        return 0;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (st->end - st->p >= 24) { /* most ids: a short positive integer */
        uint64_t d;
        int k = short_uint(st->p, &d);
        if (k) {
            st->p += k;
            if (how == A_STR) {
                v->kind = V_STR;
                v->s = start;
                v->len = k;
                v->escaped = 0;
                v->quoted = 0;
            } else {
                v->kind = V_INT;
                v->i = (int64_t)d;
            }
            return 0;
        }
    }
#endif
    if (c == '-' || (c >= '0' && c <= '9')) {
        Number n;
        int ok;
        if (scan_number(st, &n)) return -1;
        if (!n.is_int) { v->kind = V_BAD; return 0; }
        if (how == A_STR) {
            /* str(int): the literal, except that "-0" is "0" */
            if (n.neg && n.int_n == 1 && n.int_s[0] == '0') { v->kind = V_BAD; return 0; }
            v->kind = V_STR;
            v->s = start;
            v->len = st->p - start;
            v->escaped = 0;
            v->quoted = 0;
            return 0;
        }
        if (n.int_n <= 18) { v->i = n.neg ? -(int64_t)n.int_v : (int64_t)n.int_v; ok = 1; }
        else v->i = digits_value(n.int_s, n.int_n, n.neg, &ok);
        v->kind = ok ? V_INT : V_BAD;
        return 0;
    }
    if (skip_value(st)) return -1;
    v->kind = V_BAD;
    return 0;
}

#define EXACT_LIMIT_US (INT64_C(1) << 43)

/* The number at [start, end) as a double (correctly rounded, as msgspec reads it); 0 if too long. */
static int text_double(const unsigned char *start, const unsigned char *end, double *d) {
    char buf[64];
    Py_ssize_t len = end - start;
    if (len >= (Py_ssize_t)sizeof(buf)) return 0;
    memcpy(buf, start, (size_t)len);
    buf[len] = 0;
    *d = strtod(buf, NULL);
    return isfinite(*d);
}

/* ts/dur: µs to integer ns as chrome._us_to_ns / _exact_ns do. At most 3 decimals: exact integer
 * arithmetic (both of that module's ways give the same). More decimals or an exponent: its float64
 * arithmetic, valid only in a document that takes that way (no ts written with a decimal point at or
 * beyond 2**43 µs: see parse_doc). Beyond 2**53 µs, or at 2**62 ns, the msgspec path decides. */
static int read_time(State *st, Val *v, int is_ts) {
    if (v->kind != V_ABSENT) FAIL(st, "duplicate key");
    if (st->p >= st->end) FAIL(st, "value runs past the end");
    unsigned char c = *st->p;
    if (c == 'n') {
        if (match_literal(st, "null", 4)) return -1;
        v->kind = V_NULL;
        return 0;
    }
    if (!(c == '-' || (c >= '0' && c <= '9'))) {
        if (skip_value(st)) return -1;
        v->kind = V_BAD;
        return 0;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (st->end - st->p >= 24) { /* most times: whole µs */
        uint64_t us;
        int k = short_uint(st->p, &us);
        if (k) {
            st->p += k;
            /* at and beyond 2**62 ns the msgspec path's range check depends on the piece (as below) */
            if (us >= UINT64_C(4611686018427387)) { v->kind = V_BAD; return 0; }
            v->kind = V_INT;
            v->i = (int64_t)us * 1000;
            return 0;
        }
    }
#endif
    const unsigned char *start = st->p;
    Number n;
    double d;
    if (scan_number(st, &n)) return -1;
    if (n.int_n > 16) { v->kind = V_BAD; return 0; }
    int64_t whole = (int64_t)n.int_v; /* at most 16 digits */
    if (whole >= (INT64_C(1) << 53)) { v->kind = V_BAD; return 0; }
    if (is_ts && !n.is_int
        && (whole >= EXACT_LIMIT_US
            || (whole == EXACT_LIMIT_US - 1 && text_double(start, st->p, &d) && fabs(d) >= (double)EXACT_LIMIT_US)))
        st->exact_times = 1;
    if (n.has_exp || n.frac_n > 3) {
        if (!text_double(start, st->p, &d) || fabs(d) >= (double)EXACT_LIMIT_US) { v->kind = V_BAD; return 0; }
        double w = floor(d);
        v->kind = V_INT;
        v->i = (int64_t)w * 1000 + (int64_t)nearbyint((d - w) * 1000.0);
        st->float_times = 1;
        return 0;
    }
    int64_t frac = 0;
    for (Py_ssize_t k = 0; k < 3; k++) frac = frac * 10 + (k < n.frac_n ? n.frac_s[k] - '0' : 0);
    /* at and beyond 2**62 ns the msgspec path's range check depends on the piece: leave it to that path */
    if (whole >= INT64_C(4611686018427387)) { v->kind = V_BAD; return 0; }
    int64_t ns = whole * 1000 + frac;
    v->kind = V_INT;
    v->i = n.neg ? -ns : ns;
    return 0;
}

/* `read_time`, its most frequent case inline: a time in whole µs (up to 16 digits). */
static ALWAYS_INLINE int read_time_inline(State *st, Val *v, int is_ts) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t us;
    int k;
    if (v->kind == V_ABSENT && st->end - st->p >= 24 && (k = short_uint(st->p, &us))
        && us < UINT64_C(4611686018427387)) { /* below 2**62 ns (read_time says why) */
        st->p += k;
        v->kind = V_INT;
        v->i = (int64_t)us * 1000;
        return 0;
    }
#endif
    return read_time(st, v, is_ts);
}

static int key_is(const unsigned char *s, Py_ssize_t len, const char *key) {
    size_t n = strlen(key);
    return (size_t)len == n && !memcmp(s, key, n);
}

/* At an object's '{': 1 when it is empty (and closed), 0 when a member follows, -1 on failure. */
static int object_open(State *st) {
    if (++st->depth > MAX_DEPTH) FAIL(st, "nested too deeply");
    st->p++;
    skip_ws(st);
    if (st->p < st->end && *st->p == '}') { st->p++; st->depth--; return 1; }
    return 0;
}

/* A member's key (one without escapes: an escaped key could spell a known one) and its ':'. */
static int member_key(State *st, const unsigned char **k, Py_ssize_t *klen) {
    int esc;
    if (st->p >= st->end || *st->p != '"') FAIL(st, "expected a key");
    if (scan_string(st, k, klen, &esc)) return -1;
    if (esc) FAIL(st, "escaped key");
    skip_ws(st);
    if (st->p >= st->end || *st->p != ':') FAIL(st, "expected ':'");
    st->p++;
    skip_ws(st);
    return 0;
}

/* After a member's value: 1 when another member follows, 0 when the object closed, -1 on failure. */
static int member_next(State *st) {
    skip_ws(st);
    if (st->p >= st->end) FAIL(st, "object runs past the end");
    if (*st->p == ',') { st->p++; skip_ws(st); return 1; }
    if (*st->p == '}') { st->p++; st->depth--; return 0; }
    FAIL(st, "expected ',' or '}'");
}

typedef int (*MemberFn)(State *st, const unsigned char *k, Py_ssize_t klen, void *ctx);

/* An object at its '{', each member's value read by `member` (which is at the value). */
static inline int each_member(State *st, MemberFn member, void *ctx) {
    int empty = object_open(st);
    if (empty) return empty < 0 ? -1 : 0;
    int more;
    do {
        const unsigned char *k;
        Py_ssize_t klen;
        if (member_key(st, &k, &klen)) return -1;
        int rc = member(st, k, klen, ctx);
        if (rc) return rc;
    } while ((more = member_next(st)) == 1);
    return more;
}

/* Whether the n bytes at `a` spell `key` (n long): two 8-byte compares for the usual lengths. */
static inline int same_key(const unsigned char *a, const char *key, Py_ssize_t n) {
    if (n >= 8 && n <= 16) {
        uint64_t x, y, u, v;
        memcpy(&x, a, 8);
        memcpy(&y, key, 8);
        memcpy(&u, a + n - 8, 8);
        memcpy(&v, key + n - 8, 8);
        return x == y && u == v;
    }
    return !memcmp(a, key, (size_t)n);
}

/* What an event's member key names; the values of those up to E_TID (and of others, skipped) are
 * kept in the member memo. */
enum { E_PH, E_NAME, E_CAT, E_PID, E_TID, E_TS, E_DUR, E_ARGS, E_OTHER };

static int event_key_id(const unsigned char *k, Py_ssize_t klen) {
    if (key_is(k, klen, "ph")) return E_PH;
    if (key_is(k, klen, "name")) return E_NAME;
    if (key_is(k, klen, "cat")) return E_CAT;
    if (key_is(k, klen, "ts")) return E_TS;
    if (key_is(k, klen, "dur")) return E_DUR;
    if (key_is(k, klen, "pid")) return E_PID;
    if (key_is(k, klen, "tid")) return E_TID;
    if (key_is(k, klen, "args")) return E_ARGS;
    return E_OTHER;
}

/* The ARG_KEYS index an args key names, -1 for the others. */
static int args_key_id(const unsigned char *k, Py_ssize_t klen) {
    if (klen > 0 && klen < MAX_KEY_LEN)
        for (const signed char *a = KEYS_BY_LEN[klen]; *a >= 0; a++)
            if (k[0] == (unsigned char)ARG_KEYS[*a].key[0] && same_key(k, ARG_KEYS[*a].key, klen)) return *a;
    return -1;
}

/* How much of the token t the bytes at p repeat (p has TOK_BYTES readable): 2 the key and the kept
 * value, 1 the key only, 0 not the key. */
static ALWAYS_INLINE int tok_match(const unsigned char *p, const KeyTok *t) {
#if defined(__SSE2__) && defined(__GNUC__)
    uint64_t same = equal_bits(p, t->tok, t->full_len);
    uint64_t differ = ~same;
    if (differ & t->key_bits) return 0;
    return t->full_len == t->key_len || (differ & t->full_bits) ? 1 : 2;
#else
    if (!same_bytes(p, t->tok, t->key_len)) return 0;
    return t->full_len == t->key_len || !same_bytes(p, t->tok, t->full_len) ? 1 : 2;
#endif
}

typedef int (*KeyIdFn)(const unsigned char *k, Py_ssize_t klen);

/* Where a member was met: to keep its bytes once its value is read. */
typedef struct {
    const unsigned char *start; /* the token's first byte */
    int key_len;                /* the token's length up to the value */
    int known;                  /* the slot holds that key already */
    KeyTok *slot;               /* its memo slot; NULL past MEMO_SLOTS */
} Member;

/* The n bytes at p as a token met; the first `key_len` are the separator and key, any more the value. */
static void keep_token(State *st, KeyTok *t, const unsigned char *p, int key_len, Py_ssize_t n, int id) {
    Py_ssize_t room = st->end - p;
    if (room >= TOK_BYTES) memcpy(t->tok, p, TOK_BYTES); /* a fixed size: a few vector moves */
    else memcpy(t->tok, p, (size_t)room);
    t->key_len = key_len;
    t->full_len = (int)n;
    t->key_bits = (UINT64_C(1) << key_len) - 1; /* both under 64 */
    t->full_bits = (UINT64_C(1) << n) - 1;
    t->id = id;
}

/* A member's bytes kept in its slot once its value is read (st->p after it): with the value when
 * `keep` and short enough, `v` what it read as (NULL: skipped). A slot whose key came again with
 * another value keeps the new one, but where the values keep changing (ids, times of day) only
 * every 16th: copying costs more than the rare repeat saves. */
static inline void keep_member(State *st, const Member *m, int id, int keep, const Val *v) {
    KeyTok *t = m->slot;
    if (!t) return;
    Py_ssize_t n = st->p - m->start;
    if (m->known) { /* the key is there already: only a value to keep */
        if (!keep || n > MEMO_BYTES || (++t->changes > 2 && (t->changes & 15))) return;
    } else {
        if (m->key_len > MEMO_BYTES) return;
        if (!keep || n > MEMO_BYTES) n = m->key_len;
        t->changes = 0;
    }
    keep_token(st, t, m->start, m->key_len, n, id);
    if (n == m->key_len) return;
    unsigned char c = m->start[m->key_len];
    t->number = c == '-' || (c >= '0' && c <= '9');
    if (v) {
        t->val = *v;
        if (v->kind == V_STR || v->kind == V_RAW) t->val_at = (int)(v->s - m->start);
    } else {
        t->val.kind = V_ABSENT;
    }
}

/* Whether the kept value at p (matched as bytes) reads as it did: a number must end where it ended. */
static ALWAYS_INLINE int kept_value_holds(const KeyTok *t, const unsigned char *p) {
    if (!t->number) return 1;
    unsigned char c = p[t->full_len]; /* within TOK_BYTES */
    return !((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E');
}

/* The next member of an object, its key named by `key_id`: st->p is at the object's '{' (pos 0)
 * or at the end of member pos - 1's value. 1 when a member follows (what its key names in `id`,
 * st->p at its value; keep_member once it is read), 2 when it is the kept one of `m->slot`, value
 * and all (st->p after it), 0 when the object closed, -1 on failure. The bytes met there last time
 * (the separator, the key and its ':': `, "name": `) name the member when the same bytes come again. */
static ALWAYS_INLINE int next_member(State *st, KeyMemo *memo, int pos, KeyIdFn key_id, int *id, Member *m) {
    const unsigned char *p = st->p;
    KeyTok *ways = pos < MEMO_SLOTS ? memo->at[pos] : NULL;
    int fits = st->end - p >= TOK_BYTES;
    m->start = p;
    m->key_len = m->known = 0;
    m->slot = NULL;
    if (ways && fits) {
        int w = memo->last[pos];
        KeyTok *t = &ways[w];
        int level = t->key_len ? tok_match(p, t) : 0;
        if (!level) { /* the other member met at this position */
            t = &ways[w ^ 1];
            level = t->key_len ? tok_match(p, t) : 0;
            if (level) memo->last[pos] = (unsigned char)(w ^ 1);
        }
        if (level) {
            if (pos == 0 && ++st->depth > MAX_DEPTH) FAIL(st, "nested too deeply");
            *id = t->id;
            if (level == 2 && kept_value_holds(t, p)) {
                t->changes = 0;
                st->p = p + t->full_len;
                m->slot = t;
                return 2;
            }
            m->slot = t;
            m->key_len = t->key_len;
            m->known = 1;
            st->p = p + t->key_len;
            skip_ws(st);
            return 1;
        }
    }
    KeyTok *c = &memo->close;
    if (pos && c->key_len && fits && tok_match(p, c)) {
        st->p = p + c->key_len;
        st->depth--;
        return 0;
    }
    int more;
    if (pos == 0) {
        more = object_open(st);
        more = more < 0 ? -1 : !more;
    } else {
        more = member_next(st);
        if (more == 0 && st->p - p <= MEMO_BYTES) keep_token(st, c, p, (int)(st->p - p), st->p - p, 0);
    }
    if (more <= 0) return more;
    const unsigned char *k;
    Py_ssize_t klen;
    if (member_key(st, &k, &klen)) return -1;
    *id = key_id(k, klen);
    m->key_len = (int)(st->p - p);
    if (ways) { /* kept in place of the member met less recently here */
        memo->last[pos] ^= 1;
        m->slot = &ways[memo->last[pos]];
    }
    return 1;
}

/* A member's value into v (NULL: skipped): what its bytes read as before when next_member found
 * them kept (`found` 2), else read as `how` and kept. */
static ALWAYS_INLINE int member_value(State *st, const Member *m, int found, int id, Val *v, int how) {
    if (found == 2) {
        if (!v) return 0;
        if (v->kind != V_ABSENT) FAIL(st, "duplicate key");
        *v = m->slot->val;
        if (v->kind == V_STR || v->kind == V_RAW) v->s = m->start + m->slot->val_at;
        return 0;
    }
    if (v ? read_val(st, v, how) : skip_value(st)) return -1;
    keep_member(st, m, id, 1, v);
    return 0;
}

static int parse_args(State *st, Event *ev) {
    int more, pos = 0, a;
    Member m;
    while ((more = next_member(st, &st->args_keys, pos++, args_key_id, &a, &m)) > 0) {
        Val *v = NULL;
        if (a >= 0) {
            if (ev->args_set & (UINT32_C(1) << a)) FAIL(st, "duplicate key");
            ev->args_set |= UINT32_C(1) << a;
            v = &ev->args[a];
            v->kind = V_ABSENT;
        }
        if (member_value(st, &m, more, a, v, a >= 0 ? ARG_KEYS[a].how : 0)) return -1;
    }
    return more;
}

static int event_member(State *st, int id, Event *ev, const Member *m, int found) {
    int rc;
    switch (id) {
    case E_PH:
        rc = member_value(st, m, found, id, &ev->ph, A_STR);
        if (!rc && ev->ph.kind != V_NULL && (ev->ph.kind != V_STR || !ev->ph.quoted || ev->ph.escaped))
            FAIL(st, "ph is not a plain string");
        break;
    case E_NAME: rc = member_value(st, m, found, id, &ev->name, A_STR); break;
    case E_CAT: rc = member_value(st, m, found, id, &ev->cat, A_STR); break;
    case E_PID: rc = member_value(st, m, found, id, &ev->pid, A_INT); break;
    case E_TID: rc = member_value(st, m, found, id, &ev->tid, A_INT); break;
    case E_TS:
        rc = read_time_inline(st, &ev->ts, 1);
        keep_member(st, m, id, 0, NULL);
        break;
    case E_DUR:
        rc = read_time_inline(st, &ev->dur, 0);
        keep_member(st, m, id, 0, NULL);
        break;
    case E_ARGS:
        if (ev->has_args) FAIL(st, "duplicate key");
        ev->has_args = 1;
        keep_member(st, m, id, 0, NULL); /* before the args' members move st->p */
        if (st->p < st->end && *st->p == '{') {
            rc = parse_args(st, ev);
        } else {
            ev->bad = 1;
            rc = skip_value(st);
        }
        break;
    default: rc = member_value(st, m, found, id, NULL, 0);
    }
    return rc ? -1 : 0;
}

static int parse_event(State *st, Event *ev) {
    ev->ph.kind = ev->name.kind = ev->cat.kind = ev->ts.kind = ev->dur.kind = ev->pid.kind = ev->tid.kind = V_ABSENT;
    ev->has_args = ev->bad = 0;
    ev->args_set = 0;
    int more, pos = 0, id;
    Member m;
    while ((more = next_member(st, &st->event_keys, pos++, event_key_id, &id, &m)) > 0)
        if (event_member(st, id, ev, &m, more)) return -1;
    return more;
}

static unsigned char IS_ARGS_COL[NCOLS]; /* filled at import */

static int reserve_rows(State *st, Py_ssize_t cap) {
    if (cap <= st->cap_rows) return 0;
    if (st->cap_rows && cap < 2 * st->cap_rows) cap = 2 * st->cap_rows; /* growing by copies: geometric */
    for (int c = 0; c < NCOLS; c++) {
        if (IS_ARGS_COL[c] && !st->cols[c]) continue; /* still all null */
        int64_t *m = realloc(st->cols[c], (size_t)cap * sizeof(int64_t));
        if (!m) { PyErr_NoMemory(); return -1; }
        st->cols[c] = m;
    }
    st->cap_rows = cap;
    return 0;
}

/* Nulls in rows [from, to) of the args column(s) of ARG_KEYS[a]. */
static void null_args(State *st, int a, Py_ssize_t from, Py_ssize_t to) {
    int64_t null = ARG_KEYS[a].how == A_STR ? -1 : ARG_KEYS[a].how == A_RAW ? 0 : NULL_INT;
    int64_t *c = st->cols[ARG_KEYS[a].col], *len = ARG_KEYS[a].how == A_RAW ? st->cols[ARG_KEYS[a].col + 1] : NULL;
    for (Py_ssize_t r = from; r < to; r++) c[r] = null;
    if (len) memset(len + from, 0, (size_t)(to - from) * sizeof(int64_t));
}

/* Nulls in the allocated args columns of the next rows (a block at a time: absent args are then
 * never written). */
static void fill_nulls(State *st) {
    Py_ssize_t from = st->filled, to = from + 4096 < st->cap_rows ? from + 4096 : st->cap_rows;
    for (int a = 0; a < N_ARG_KEYS; a++)
        if (st->cols[ARG_KEYS[a].col]) null_args(st, a, from, to);
    st->filled = to;
}

/* The first value of ARG_KEYS[a] among the rows: its column(s), null up to where rows are filled. */
static int args_column(State *st, int a) {
    int n = ARG_KEYS[a].how == A_RAW ? 2 : 1;
    for (int k = 0; k < n; k++) {
        st->cols[ARG_KEYS[a].col + k] = malloc((size_t)st->cap_rows * sizeof(int64_t));
        if (!st->cols[ARG_KEYS[a].col + k]) { /* none of them then: the column stays all null */
            for (int j = 0; j < k; j++) { free(st->cols[ARG_KEYS[a].col + j]); st->cols[ARG_KEYS[a].col + j] = NULL; }
            PyErr_NoMemory();
            return -1;
        }
    }
    null_args(st, a, 0, st->filled);
    return 0;
}

/* Back to `rows` rows: the args columns of the rows dropped get nulls again when reached. */
static void truncate_rows(State *st, Py_ssize_t rows) {
    st->n_rows = rows;
    if (st->filled > rows) st->filled = rows;
}

static int grow_rows(State *st) { return reserve_rows(st, st->cap_rows ? st->cap_rows * 2 : 4096); }

/* A string's hash, 8 bytes at a time. */
static uint64_t str_hash(const unsigned char *s, Py_ssize_t n) {
    uint64_t h = UINT64_C(0x9E3779B97F4A7C15) ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t x;
        memcpy(&x, s, 8);
        h = (h ^ x) * UINT64_C(0xFF51AFD7ED558CCD);
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t x = 0;
    memcpy(&x, s, (size_t)n);
    h = (h ^ x) * UINT64_C(0xC4CEB9FE1A85EC53);
    return h ^ (h >> 32);
}

static int unescape(State *st, const unsigned char *s, Py_ssize_t len, Py_ssize_t *out_len) {
    /* escapes were validated by scan_string; the output is never longer than the input */
    if (st->scratch_cap < len + 1) {
        unsigned char *m = PyMem_Realloc(st->scratch, (size_t)len + 1);
        if (!m) { PyErr_NoMemory(); return -1; }
        st->scratch = m;
        st->scratch_cap = len + 1;
    }
    unsigned char *o = st->scratch;
    Py_ssize_t k = 0;
    while (k < len) {
        unsigned char c = s[k];
        if (c != '\\') { *o++ = c; k++; continue; }
        unsigned char e = s[k + 1];
        k += 2;
        switch (e) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            int v = (hexval(s[k]) << 12) | (hexval(s[k + 1]) << 8) | (hexval(s[k + 2]) << 4) | hexval(s[k + 3]);
            k += 4;
            if (v < 0x80) *o++ = (unsigned char)v;
            else if (v < 0x800) { *o++ = (unsigned char)(0xC0 | (v >> 6)); *o++ = (unsigned char)(0x80 | (v & 0x3F)); }
            else {
                *o++ = (unsigned char)(0xE0 | (v >> 12));
                *o++ = (unsigned char)(0x80 | ((v >> 6) & 0x3F));
                *o++ = (unsigned char)(0x80 | (v & 0x3F));
            }
            break;
        }
        default: *o++ = e; break; /* " \ / */
        }
    }
    *out_len = o - st->scratch;
    return 0;
}

/* The index of a string among the interned ones, adding it when new. */
static int64_t intern(State *st, const unsigned char *s, Py_ssize_t len, int escaped) {
    if (escaped) {
        Py_ssize_t n;
        if (unescape(st, s, len, &n)) return -1;
        s = st->scratch;
        len = n;
    }
    uint64_t h = str_hash(s, len);
    if (st->n_slots == 0 || (st->n_strings + 1) * 2 > st->n_slots) {
        Py_ssize_t n_new = st->n_slots ? st->n_slots * 2 : 1024;
        Slot *m = PyMem_Calloc((size_t)n_new, sizeof(Slot));
        if (!m) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t k = 0; k < st->n_slots; k++) {
            if (!st->slots[k].index) continue;
            Py_ssize_t j = (Py_ssize_t)(st->slots[k].hash & (uint64_t)(n_new - 1));
            while (m[j].index) j = (j + 1) & (n_new - 1);
            m[j] = st->slots[k];
        }
        PyMem_Free(st->slots);
        st->slots = m;
        st->n_slots = n_new;
    }
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(st->n_slots - 1));
    while (st->slots[j].index) {
        Slot *sl = &st->slots[j];
        if (sl->hash == h && sl->len == len && (len == 0 || !memcmp(st->arena + sl->at, s, (size_t)len)))
            return sl->index - 1;
        j = (j + 1) & (st->n_slots - 1);
    }
    if (st->arena_len + len > INT32_MAX) { /* Arrow views address 2 GiB: the msgspec path reads it */
        st->fail = "over 2 GiB of distinct strings";
        return -2;
    }
    if (st->arena_len + len > st->arena_cap) {
        Py_ssize_t cap = st->arena_cap ? st->arena_cap : 65536;
        while (cap < st->arena_len + len) cap *= 2;
        unsigned char *m = realloc(st->arena, (size_t)cap);
        if (!m) { PyErr_NoMemory(); return -1; }
        st->arena = m;
        st->arena_cap = cap;
    }
    if (st->n_strings == st->spans_cap) {
        Py_ssize_t cap = st->spans_cap ? st->spans_cap * 2 : 1024;
        Py_ssize_t *m = PyMem_Realloc(st->spans, (size_t)cap * 2 * sizeof(Py_ssize_t));
        if (!m) { PyErr_NoMemory(); return -1; }
        st->spans = m;
        st->spans_cap = cap;
    }
    if (len) memcpy(st->arena + st->arena_len, s, (size_t)len);
    st->spans[2 * st->n_strings] = st->arena_len;
    st->spans[2 * st->n_strings + 1] = len;
    Slot *sl = &st->slots[j];
    sl->hash = h;
    sl->at = st->arena_len;
    sl->len = len;
    sl->index = ++st->n_strings;
    st->arena_len += len;
    return sl->index - 1;
}

#define PY_FAILED (-2)

/* String column value: an index, or -1 for null. `err`: 1 a Python error, 2 the document is declined. */
static int64_t str_code(State *st, const Val *v, int *err) {
    if (v->kind != V_STR) return -1;
    int64_t c = intern(st, v->s, v->len, v->escaped);
    if (c < 0) *err = c == -2 ? 2 : 1;
    return c;
}

/* `str_code`, answered by the code `*last` when the string is the one that code names (a column's
 * value is often the previous row's: `"X"`, `"cpu_op"`), without hashing or probing. */
static inline int64_t str_code_as_last(State *st, const Val *v, int64_t *last, int *err) {
    int64_t c = *last;
    if (v->kind == V_STR && !v->escaped && c >= 0 && c < st->n_strings && st->spans[2 * c + 1] == v->len
        && !memcmp(st->arena + st->spans[2 * c], v->s, (size_t)v->len))
        return c;
    c = str_code(st, v, err);
    if (c >= 0) *last = c;
    return c;
}

/* A thread id written as a string of decimal digits (`"tid": "25738"`, the 2021 Kineto layout) as its
 * integer; any other string (`"stream 7"`) null. As chrome.py's `_tid_series`: 1 to 18 ASCII digits. */
static int64_t digits_id(const Val *v) {
    if (v->len < 1 || v->len > 18) return NULL_INT;
    int64_t n = 0;
    for (Py_ssize_t k = 0; k < v->len; k++) {
        unsigned char ch = v->s[k];
        if (ch < '0' || ch > '9') return NULL_INT;
        n = n * 10 + (ch - '0');
    }
    return n;
}

static int emit(State *st, Event *ev, int phase) {
    /* checks: every field a row reads has a type the columns can hold */
    if (ev->bad) FAIL(st, "an event field of another type");
    if (ev->name.kind == V_BAD || ev->cat.kind == V_BAD || ev->ts.kind == V_BAD || ev->dur.kind == V_BAD
        || (ev->name.kind == V_STR && !ev->name.quoted) || (ev->cat.kind == V_STR && !ev->cat.quoted))
        FAIL(st, "an event field of another type");
    if (ev->pid.kind == V_BAD || ev->tid.kind == V_BAD) FAIL(st, "an id of another type");
    if (ev->tid.kind == V_STR && (ev->tid.escaped || !ev->tid.quoted)) FAIL(st, "a thread id string with escapes");
    for (uint32_t set = ev->args_set; set; set &= set - 1) {
        int a = ctz32(set);
        if (ev->args[a].kind == V_BAD || (ARG_KEYS[a].how <= A_ANY_INT && ev->args[a].kind == V_STR))
            FAIL(st, "an args field of another type");
    }
    if (st->n_rows == st->cap_rows && grow_rows(st)) return PY_FAILED;
    Py_ssize_t r = st->n_rows;
    int err = 0;
    int64_t **c = st->cols;
    c[C_PH][r] = str_code_as_last(st, &ev->ph, &st->last_code[0], &err);
    c[C_CAT][r] = str_code_as_last(st, &ev->cat, &st->last_code[1], &err);
    c[C_NAME][r] = str_code_as_last(st, &ev->name, &st->last_code[2], &err);
    c[C_PID][r] = ev->pid.kind == V_INT ? ev->pid.i : NULL_INT;
    c[C_TID][r] = ev->tid.kind == V_INT ? ev->tid.i : ev->tid.kind == V_STR ? digits_id(&ev->tid) : NULL_INT;
    c[C_TS][r] = ev->ts.kind == V_INT ? ev->ts.i : NULL_INT;
    c[C_DUR][r] = ev->dur.kind == V_INT ? ev->dur.i : NULL_INT;
    c[C_HAS_ARGS][r] = ev->has_args;
    c[C_PID_STR][r] = ev->pid.kind == V_STR ? str_code(st, &ev->pid, &err) : -1; /* tid strings: null */
    if (err) return err == 2 ? -1 : PY_FAILED;
    if (r >= st->filled) fill_nulls(st);
    for (uint32_t set = ev->args_set; set; set &= set - 1) {
        int a = ctz32(set);
        const Val *v = &ev->args[a];
        int col = ARG_KEYS[a].col;
        if (!c[col] && args_column(st, a)) return PY_FAILED;
        switch (ARG_KEYS[a].how) {
        case A_INT:
        case A_ANY_INT: c[col][r] = v->kind == V_INT ? v->i : NULL_INT; break;
        case A_STR: c[col][r] = str_code(st, v, &err); break;
        default:
            if (v->kind == V_RAW) {
                if (st->raw_len + v->len > INT32_MAX) FAIL(st, "over 2 GiB of raw args values"); /* Arrow views */
                if (st->raw_len + v->len > st->raw_cap) {
                    Py_ssize_t cap = st->raw_cap ? st->raw_cap : 65536;
                    while (cap < st->raw_len + v->len) cap *= 2;
                    unsigned char *m = realloc(st->raw, (size_t)cap);
                    if (!m) { PyErr_NoMemory(); return PY_FAILED; }
                    st->raw = m;
                    st->raw_cap = cap;
                }
                memcpy(st->raw + st->raw_len, v->s, (size_t)v->len);
                c[col][r] = st->raw_len;
                c[col + 1][r] = v->len;
                st->raw_len += v->len;
            }
        }
        if (err) return err == 2 ? -1 : PY_FAILED;
    }
    c[C_ORDER][r] = phase == 3 ? -1 : st->first_order + st->n_kept++;
    st->n_rows++;
    return 0;
}

#define RESTART (-3) /* the document needs plain mode: read it again from the start */
#define PH_OTHER 4  /* plain mode: an event of another phase, or none */

static int parse_events(State *st) {
    if (++st->depth > MAX_DEPTH) FAIL(st, "nested too deeply");
    st->p++;
    skip_ws(st);
    if (st->p < st->end && *st->p == ']') { st->p++; st->depth--; return 0; }
    Event ev;
    while (1) {
        if (st->p >= st->end || *st->p != '{') FAIL(st, "an event that is not an object");
        if (parse_event(st, &ev)) return -1;
        st->n_events++;
        /* msgspec's tagged union fails on a missing or unknown ph, and the whole document is then
         * decoded with plain structs: every event with fields, its phase a string column */
        int phase = ev.ph.kind == V_STR ? phase_code(ev.ph.s, ev.ph.len) : -100;
        if (phase == -100 && !st->plain) return RESTART;
        if (st->plain && (phase < 0 || phase > 3)) phase = PH_OTHER;
        if (phase < 0) {
            st->reasons[-1 - phase]++;
            st->last_event_row = -1;
        } else {
            int rc = emit(st, &ev, phase);
            if (rc) return rc;
            st->last_event_row = st->n_rows - 1;
        }
        skip_ws(st);
        if (st->p >= st->end) FAIL(st, "events run past the end");
        if (*st->p == ',') { st->p++; skip_ws(st); continue; }
        if (*st->p == ']') { st->p++; st->depth--; return 0; }
        FAIL(st, "expected ',' or ']'");
    }
}

static int top_member(State *st, const unsigned char *k, Py_ssize_t klen, void *ctx) {
    (void)ctx;
    if (key_is(k, klen, "traceEvents")) {
        if (st->has_events) FAIL(st, "duplicate key");
        if (st->p >= st->end || *st->p != '[') FAIL(st, "traceEvents is not a list");
        int rc = parse_events(st);
        if (rc) return rc;
        st->has_events = 1;
        return 0;
    }
    int top = -1;
    for (int t = 0; t < N_TOP; t++)
        if (key_is(k, klen, TOP_KEYS[t])) top = t;
    const unsigned char *v = st->p;
    if (skip_value(st)) return -1;
    if (top >= 0) {
        if (st->top_len[top]) FAIL(st, "duplicate key");
        st->top_at[top] = v - st->base;
        st->top_len[top] = st->p - v;
    }
    return 0;
}

static int parse_doc(State *st, int is_array) {
    if (st->end - st->p >= 3 && st->p[0] == 0xEF && st->p[1] == 0xBB && st->p[2] == 0xBF) FAIL(st, "byte-order mark");
    skip_ws(st);
    if (st->p >= st->end) FAIL(st, "empty document");
    int rc;
    if (is_array) {
        if (*st->p != '[') FAIL(st, "not an array");
        rc = parse_events(st);
        if (rc) return rc;
        st->has_events = 1;
    } else {
        if (*st->p != '{') FAIL(st, "not an object");
        rc = each_member(st, top_member, NULL);
        if (rc) return rc;
        if (!st->has_events) FAIL(st, "no traceEvents");
    }
    skip_ws(st);
    if (st->p != st->end) FAIL(st, "data after the document");
    if (st->float_times && st->exact_times) FAIL(st, "times both with ns digits past 2**43 us and with more decimals");
    return 0;
}

static void free_state(State *st) {
    for (int c = 0; c < NCOLS; c++) free(st->cols[c]);
    PyMem_Free(st->slots);
    free(st->arena);
    PyMem_Free(st->spans);
    PyMem_Free(st->scratch);
    free(st->arrays);
    free(st->raw);
    memset(st, 0, sizeof(*st));
}

/* ---- the rows as Arrow arrays (the C data interface: arrow.apache.org/docs/format/CDataInterface.html) ---- */

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#define ARROW_FLAG_NULLABLE 2

/* Bytes shared by several columns (the interned strings, the raw args values): freed with the last
 * column that points into them, on whatever thread releases it. */
typedef struct {
    int64_t refs;
    void *ptr;
} Shared;

static Shared *shared_new(void *ptr) {
    Shared *b = malloc(sizeof(Shared));
    if (!b) { free(ptr); PyErr_NoMemory(); return NULL; }
    b->refs = 1;
    b->ptr = ptr;
    return b;
}

static void shared_drop(Shared *b) {
    if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        free(b->ptr);
        free(b);
    }
}

typedef struct {
    const void *buffers[4];
    void *own[3]; /* freed with the column: validity, values or views, the views' buffer sizes */
    Shared *data; /* the bytes a view column points into */
    Shared *zeros; /* an all-null view column's validity and views: zeros shared by every such column */
    struct ArrowArray dict; /* a K_CAT column's dictionary (release NULL when none, or moved out) */
} ColumnData;

static void release_column(struct ArrowArray *a) {
    ColumnData *d = a->private_data;
    if (d->dict.release) d->dict.release(&d->dict);
    for (int k = 0; k < 3; k++) free(d->own[k]);
    shared_drop(d->data);
    shared_drop(d->zeros);
    free(d);
    a->release = NULL;
}

typedef struct {
    const void *buffers[1];
    struct ArrowArray *children;
    struct ArrowArray **pointers;
} StructData;

/* A consumer may have moved some children out (their release is then NULL). */
static void release_struct(struct ArrowArray *a) {
    StructData *d = a->private_data;
    for (int64_t k = 0; k < a->n_children; k++)
        if (d->children[k].release) d->children[k].release(&d->children[k]);
    free(d->children);
    free(d->pointers);
    free(d);
    a->release = NULL;
}

typedef struct {
    struct ArrowSchema *children;
    struct ArrowSchema **pointers;
    struct ArrowSchema *dicts; /* the dictionaries' schemas of the K_CAT children */
} SchemaData;

/* Static strings only; a dictionary schema lives in its parent's SchemaData. */
static void release_child_schema(struct ArrowSchema *s) {
    if (s->dictionary && s->dictionary->release) s->dictionary->release(s->dictionary);
    s->release = NULL;
}

static void release_schema(struct ArrowSchema *s) {
    SchemaData *d = s->private_data;
    for (int64_t k = 0; k < s->n_children; k++)
        if (d->children[k].release) d->children[k].release(&d->children[k]);
    free(d->children);
    free(d->pointers);
    free(d->dicts);
    free(d);
    s->release = NULL;
}

/* By kind: utf8 view, int64, bool, binary view, and (K_CAT) uint32 indices into a utf8 dictionary. */
static const char *FORMATS[] = {"vu", "l", "b", "vz", "I"};

static int make_schema(struct ArrowSchema *s) {
    SchemaData *d = calloc(1, sizeof(SchemaData));
    if (d) d->children = calloc(N_OUT, sizeof(struct ArrowSchema));
    if (d) d->pointers = calloc(N_OUT, sizeof(struct ArrowSchema *));
    if (d) d->dicts = calloc(N_OUT, sizeof(struct ArrowSchema));
    if (!d || !d->children || !d->pointers || !d->dicts) {
        if (d) { free(d->children); free(d->pointers); free(d->dicts); free(d); }
        PyErr_NoMemory();
        return -1;
    }
    for (int k = 0; k < N_OUT; k++) {
        struct ArrowSchema *c = &d->children[k];
        c->format = FORMATS[OUT_COLS[k].kind];
        c->name = OUT_COLS[k].name;
        c->flags = ARROW_FLAG_NULLABLE;
        c->release = release_child_schema;
        if (OUT_COLS[k].kind == K_CAT) {
            struct ArrowSchema *v = &d->dicts[k];
            v->format = "u";
            v->name = "";
            v->release = release_child_schema;
            c->dictionary = v;
        }
        d->pointers[k] = c;
    }
    memset(s, 0, sizeof(*s));
    s->format = "+s";
    s->name = "";
    s->n_children = N_OUT;
    s->children = d->pointers;
    s->release = release_schema;
    s->private_data = d;
    return 0;
}

static unsigned char BITS_SET[256]; /* how many bits each byte has set; filled at import */

/* A validity bitmap (bit set: valid) of n rows, or NULL when every row is valid. */
static int validity(const int64_t *v, Py_ssize_t n, int64_t null_value, uint8_t **out, int64_t *nulls) {
    uint8_t *bits = malloc((size_t)(n / 8 + 1));
    if (!bits) { PyErr_NoMemory(); return -1; }
    int64_t valid = 0;
    Py_ssize_t r = 0;
#if defined(__SSE2__) && defined(__GNUC__)
    /* a byte at a time, two rows a compare: 64-bit equality from the 32-bit one of both halves */
    const __m128i null2 = _mm_set1_epi64x(null_value);
    for (; r + 8 <= n; r += 8) {
        unsigned is_null = 0;
        for (int k = 0; k < 8; k += 2) {
            __m128i eq = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(v + r + k)), null2);
            eq = _mm_and_si128(eq, _mm_shuffle_epi32(eq, _MM_SHUFFLE(2, 3, 0, 1)));
            is_null |= (unsigned)_mm_movemask_pd(_mm_castsi128_pd(eq)) << k;
        }
        unsigned b = ~is_null & 0xFF;
        bits[r >> 3] = (uint8_t)b;
        valid += BITS_SET[b];
    }
#endif
    for (; r + 8 <= n; r += 8) { /* a byte at a time, without branches (nor a popcount: without -mpopcnt, a call) */
        unsigned b = 0;
        for (int k = 0; k < 8; k++) {
            unsigned ok = v[r + k] != null_value;
            b |= ok << k;
            valid += ok;
        }
        bits[r >> 3] = (uint8_t)b;
    }
    if (r < n) {
        unsigned b = 0;
        for (int k = 0; r + k < n; k++) {
            unsigned ok = v[r + k] != null_value;
            b |= ok << k;
            valid += ok;
        }
        bits[r >> 3] = (uint8_t)b;
    }
    if (valid == n) { free(bits); bits = NULL; }
    *out = bits;
    *nulls = n - valid;
    return 0;
}

/* Arrow views (and their validity) of the strings (K_STR: interned indexes, -1 null) or raw values
 * (K_RAW: offsets and lengths, length 0 null) of a stored column, into `data`. */
static int views(State *st, const OutCol *oc, const unsigned char *data, uint8_t **views_out, uint8_t **bits_out,
                 int64_t *nulls) {
    Py_ssize_t n = st->n_rows;
    const int64_t *v = st->cols[oc->col], *lens = oc->kind == K_RAW ? st->cols[oc->col + 1] : NULL;
    uint8_t *out = calloc((size_t)(n ? n : 1), 16), *bits = calloc((size_t)(n / 8 + 1), 1);
    if (!out || !bits) { free(out); free(bits); PyErr_NoMemory(); return -1; }
    int64_t valid = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        int64_t at, len;
        if (lens) {
            len = lens[r];
            at = v[r];
            if (!len) continue; /* a JSON value is never empty */
        } else {
            if (v[r] < 0) continue;
            at = st->spans[2 * v[r]];
            len = st->spans[2 * v[r] + 1];
        }
        bits[r >> 3] |= (uint8_t)(1u << (r & 7));
        valid++;
        uint8_t *w = out + 16 * r;
        int32_t size = (int32_t)len, offset = (int32_t)at, buffer = 0;
        memcpy(w, &size, 4);
        if (size <= 12) {
            if (size) memcpy(w + 4, data + at, (size_t)size);
        } else {
            memcpy(w + 4, data + at, 4);
            memcpy(w + 8, &buffer, 4);
            memcpy(w + 12, &offset, 4);
        }
    }
    if (valid == n) { free(bits); bits = NULL; }
    *views_out = out;
    *bits_out = bits;
    *nulls = n - valid;
    return 0;
}

/* One exported column from the stored one(s) of OUT_COLS[k]; frees what the column does not keep. */
/* Whether a view column (K_STR or K_RAW) holds no value at all (the rare args: most files have none). */
static int all_null(State *st, const OutCol *oc) {
    const int64_t *v = st->cols[oc->kind == K_RAW ? oc->col + 1 : oc->col];
    int64_t none = oc->kind == K_RAW ? 0 : -1;
    for (Py_ssize_t r = 0; r < st->n_rows; r++)
        if (v[r] != none) return 0;
    return 1;
}

/* A reference to the block of zeros all-null columns share (16 bytes a row: a view, or less), made once. */
static int zero_block(State *st, Shared **zeros) {
    if (!*zeros) {
        void *z = calloc((size_t)(st->n_rows ? st->n_rows : 1), 16);
        if (!z) { PyErr_NoMemory(); return -1; }
        if (!(*zeros = shared_new(z))) return -1;
    }
    __atomic_add_fetch(&(*zeros)->refs, 1, __ATOMIC_RELAXED);
    return 0;
}

/* The dictionary of a K_CAT column: every interned string, as utf8 (offsets into the arena, which
 * holds the strings back to back in their order: `intern` only appends). */
static int make_dictionary(State *st, Shared *arena, struct ArrowArray *a) {
    Py_ssize_t n = st->n_strings;
    ColumnData *d = calloc(1, sizeof(ColumnData));
    int32_t *offsets = malloc((size_t)(n + 1) * sizeof(int32_t));
    if (!d || !offsets) { free(d); free(offsets); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < n; k++) offsets[k] = (int32_t)st->spans[2 * k];
    offsets[n] = (int32_t)st->arena_len; /* under INT32_MAX: `intern` declines beyond */
    memset(a, 0, sizeof(*a));
    a->length = n;
    a->n_buffers = 3;
    d->own[1] = offsets;
    __atomic_add_fetch(&arena->refs, 1, __ATOMIC_RELAXED);
    d->data = arena;
    d->buffers[1] = offsets;
    d->buffers[2] = arena->ptr;
    a->buffers = d->buffers;
    a->private_data = d;
    a->release = release_column;
    return 0;
}

/* A K_CAT column's indices and validity, from the stored codes (a null row's index is 0: never read,
 * so valid even where the dictionary is empty). */
static int category_indices(State *st, const int64_t *v, uint32_t **out, uint8_t **bits, int64_t *nulls) {
    Py_ssize_t n = st->n_rows;
    if (validity(v, n, -1, bits, nulls)) return -1;
    uint32_t *idx = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    if (!idx) { free(*bits); *bits = NULL; PyErr_NoMemory(); return -1; }
    for (Py_ssize_t r = 0; r < n; r++) idx[r] = v[r] < 0 ? 0 : (uint32_t)v[r];
    *out = idx;
    return 0;
}

static int make_column(State *st, int k, Shared *arena, Shared *raw, Shared **zeros, struct ArrowArray *a) {
    const OutCol *oc = &OUT_COLS[k];
    Py_ssize_t n = st->n_rows;
    ColumnData *d = calloc(1, sizeof(ColumnData));
    if (!d) { PyErr_NoMemory(); return -1; }
    memset(a, 0, sizeof(*a));
    a->length = n;
    a->n_buffers = 2;
    a->buffers = d->buffers;
    a->private_data = d;
    a->release = release_column;
    int64_t *v = st->cols[oc->col];
    uint8_t *bits = NULL;
    if (!v && oc->kind == K_INT) { /* an args column no row set: zero validity bits (the values unread) */
        if (zero_block(st, zeros)) goto fail;
        d->zeros = *zeros;
        d->buffers[0] = d->buffers[1] = (*zeros)->ptr;
        a->null_count = n;
        return 0;
    }
    if (oc->kind == K_INT) {
        if (validity(v, n, NULL_INT, &bits, &a->null_count)) goto fail;
        d->own[0] = bits;
        /* the values as stored: the column keeps them, less the room reserved for rows never read */
        int64_t *fit = n ? realloc(v, (size_t)n * sizeof(int64_t)) : NULL;
        d->own[1] = fit ? fit : v;
        st->cols[oc->col] = NULL;
    } else if (oc->kind == K_CAT) {
        uint32_t *idx;
        if (category_indices(st, v, &idx, &bits, &a->null_count)) goto fail;
        d->own[0] = bits;
        d->own[1] = idx;
        if (make_dictionary(st, arena, &d->dict)) goto fail;
        a->dictionary = &d->dict;
    } else if (oc->kind == K_BOOL) {
        bits = calloc((size_t)(n / 8 + 1), 1);
        if (!bits) { PyErr_NoMemory(); goto fail; }
        for (Py_ssize_t r = 0; r < n; r++)
            if (v[r]) bits[r >> 3] |= (uint8_t)(1u << (r & 7));
        d->own[1] = bits;
    } else {
        Shared *data = oc->kind == K_STR ? arena : raw;
        if (!v || all_null(st, oc)) { /* zero views, every validity bit 0: one block of zeros serves them all */
            if (zero_block(st, zeros)) goto fail;
            d->zeros = *zeros;
            d->buffers[0] = d->buffers[1] = (*zeros)->ptr;
            a->null_count = n;
        } else {
            uint8_t *vw;
            if (views(st, oc, (const unsigned char *)data->ptr, &vw, &bits, &a->null_count)) goto fail;
            d->own[0] = bits;
            d->own[1] = vw;
        }
        int64_t *sizes = malloc(sizeof(int64_t));
        if (!sizes) { PyErr_NoMemory(); goto fail; }
        *sizes = oc->kind == K_STR ? st->arena_len : st->raw_len;
        d->own[2] = sizes;
        __atomic_add_fetch(&data->refs, 1, __ATOMIC_RELAXED);
        d->data = data;
        d->buffers[2] = data->ptr;
        d->buffers[3] = sizes;
        a->n_buffers = 4;
        if (d->zeros) return 0;
    }
    d->buffers[0] = d->own[0];
    d->buffers[1] = d->own[1];
    return 0;
fail:
    release_column(a);
    return -1;
}

/* The scanner's rows as an Arrow struct array, and its interned strings (the K_CAT columns' dictionary)
 * as a utf8 array; the scanner then holds no rows and no strings. */
static int take_rows(State *st, struct ArrowArray *out, struct ArrowArray *strings) {
    Py_ssize_t n = st->n_rows;
    if (!st->cap_rows && grow_rows(st)) return -1; /* no row yet: every column empty */
    /* the bytes views point into: never NULL, even when empty */
    if (!st->arena && !(st->arena = malloc(1))) { PyErr_NoMemory(); return -1; }
    if (!st->raw && !(st->raw = malloc(1))) { PyErr_NoMemory(); return -1; }
    Shared *arena = shared_new(st->arena), *raw = NULL, *zeros = NULL;
    st->arena = NULL;
    if (arena) raw = shared_new(st->raw);
    st->raw = NULL;
    StructData *d = calloc(1, sizeof(StructData));
    if (d) d->children = calloc(N_OUT, sizeof(struct ArrowArray));
    if (d) d->pointers = calloc(N_OUT, sizeof(struct ArrowArray *));
    int rc = -1;
    if (!arena || !raw || !d || !d->children || !d->pointers) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        if (d) { free(d->children); free(d->pointers); free(d); }
        goto done;
    }
    if (make_dictionary(st, arena, strings)) {
        free(d->children); free(d->pointers); free(d);
        goto done;
    }
    memset(out, 0, sizeof(*out));
    out->length = n;
    out->n_buffers = 1;
    out->buffers = d->buffers;
    out->n_children = N_OUT;
    out->children = d->pointers;
    out->private_data = d;
    out->release = release_struct;
    for (int k = 0; k < N_OUT; k++) {
        d->pointers[k] = &d->children[k];
        if (make_column(st, k, arena, raw, &zeros, &d->children[k])) { /* it released itself; the later ones are empty */
            release_struct(out);
            goto done;
        }
    }
    rc = 0;
done:
    shared_drop(arena);
    shared_drop(raw);
    shared_drop(zeros);
    /* start afresh: the strings' indexes and the raw values' places belong to the rows just taken */
    for (int c = 0; c < NCOLS; c++) { free(st->cols[c]); st->cols[c] = NULL; }
    st->n_rows = st->cap_rows = st->filled = 0;
    st->raw_len = st->raw_cap = 0;
    st->arena_len = st->arena_cap = 0;
    st->n_strings = 0;
    PyMem_Free(st->slots);
    st->slots = NULL;
    st->n_slots = 0;
    st->can_drop = 0;
    return rc;
}

/* ---- Python types ---- */

typedef struct {
    PyObject_HEAD
    struct ArrowArray array; /* released (release NULL) once exported */
    Py_ssize_t length;
    int strings; /* a utf8 array of strings, not the struct array of the rows */
} Rows;

static void Rows_dealloc(Rows *self) {
    if (self->array.release) self->array.release(&self->array);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void schema_capsule_free(PyObject *capsule) {
    struct ArrowSchema *s = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (!s) { PyErr_Clear(); return; }
    if (s->release) s->release(s);
    free(s);
}

static void array_capsule_free(PyObject *capsule) {
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (!a) { PyErr_Clear(); return; }
    if (a->release) a->release(a);
    free(a);
}

static PyObject *Rows_arrow_c_array(Rows *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"requested_schema", NULL};
    PyObject *requested = Py_None; /* a producer may ignore it */
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O", kwlist, &requested)) return NULL;
    if (!self->array.release) { PyErr_SetString(PyExc_ValueError, "the rows were already exported"); return NULL; }
    struct ArrowSchema *s = malloc(sizeof(*s));
    struct ArrowArray *a = malloc(sizeof(*a));
    if (!s || !a) { free(s); free(a); return PyErr_NoMemory(); }
    if (self->strings) {
        memset(s, 0, sizeof(*s));
        s->format = "u";
        s->name = "";
        s->release = release_child_schema;
    } else if (make_schema(s)) {
        free(s);
        free(a);
        return NULL;
    }
    PyObject *sc = PyCapsule_New(s, "arrow_schema", schema_capsule_free);
    if (!sc) { s->release(s); free(s); free(a); return NULL; }
    *a = self->array; /* moved: the capsule owns the rows now */
    PyObject *ac = PyCapsule_New(a, "arrow_array", array_capsule_free);
    if (!ac) { a->release = NULL; free(a); Py_DECREF(sc); return NULL; }
    self->array.release = NULL;
    return Py_BuildValue("(NN)", sc, ac);
}

static Py_ssize_t Rows_len(Rows *self) { return self->length; }

static PyMethodDef ROWS_METHODS[] = {
    {"__arrow_c_array__", (PyCFunction)(void (*)(void))Rows_arrow_c_array, METH_VARARGS | METH_KEYWORDS,
     "__arrow_c_array__(requested_schema=None) -> (schema capsule, array capsule): the rows as an Arrow\n"
     "struct array (the PyCapsule interface), once."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods ROWS_SEQUENCE = {.sq_length = (lenfunc)Rows_len};

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracediag.ingest._chromescan.Rows",
    .tp_basicsize = sizeof(Rows),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanned rows (or their strings), typed, exported once through the Arrow PyCapsule interface\n"
              "(`pl.DataFrame(rows)`, `pl.Series(strings)`).",
    .tp_dealloc = (destructor)Rows_dealloc,
    .tp_methods = ROWS_METHODS,
    .tp_as_sequence = &ROWS_SEQUENCE,
};

typedef struct {
    PyObject_HEAD
    State st;
} Scanner;

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"batch_rows", NULL};
    Py_ssize_t batch_rows = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", kwlist, &batch_rows)) return -1;
    free_state(&self->st);
    self->st.batch_rows = batch_rows > 0 ? batch_rows : 0;
    return 0;
}

static void Scanner_dealloc(Scanner *self) {
    free_state(&self->st);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *piece_result(State *st, int ended, Py_ssize_t rows) {
    PyObject *reasons = PyDict_New(), *top = PyDict_New();
    if (!reasons || !top) goto fail;
    for (int k = 0; k < N_REASONS; k++) {
        if (!st->reasons[k]) continue;
        PyObject *v = PyLong_FromSsize_t(st->reasons[k]);
        if (!v || PyDict_SetItemString(reasons, REASON_NAMES[k], v)) { Py_XDECREF(v); goto fail; }
        Py_DECREF(v);
    }
    for (int t = 0; t < N_TOP; t++) {
        if (!st->top_len[t]) continue;
        PyObject *v = Py_BuildValue("(nn)", st->top_at[t], st->top_len[t]);
        if (!v || PyDict_SetItemString(top, TOP_KEYS[t], v)) { Py_XDECREF(v); goto fail; }
        Py_DECREF(v);
    }
    return Py_BuildValue("(nnNNOn)", st->n_events, st->n_kept, reasons, top, ended ? Py_True : Py_False, rows);
fail:
    Py_XDECREF(reasons);
    Py_XDECREF(top);
    return NULL;
}

/* Whether the document's last event is an M row named `marker` (UTF-8); if so it is removed. */
static int drop_marker(State *st, const char *marker, Py_ssize_t marker_len, Py_ssize_t rows_before) {
    Py_ssize_t r = st->last_event_row;
    if (r < rows_before || r != st->n_rows - 1 || st->cols[C_ORDER][r] != -1 || st->cols[C_NAME][r] < 0) return 0;
    int64_t code = st->cols[C_NAME][r];
    if (st->spans[2 * code + 1] != marker_len || memcmp(st->arena + st->spans[2 * code], marker, (size_t)marker_len))
        return 0;
    truncate_rows(st, st->n_rows - 1);
    st->n_events--;
    return 1;
}

/* Per-document state, at the start of `view`. */
static void start_doc(State *st, Py_buffer *view) {
    st->base = st->p = (const unsigned char *)view->buf;
    st->end = st->base + view->len;
    st->fail = NULL;
    st->depth = 0;
    st->n_events = st->n_kept = 0;
    st->has_events = 0;
    st->float_times = st->exact_times = 0;
    st->last_event_row = -1;
    memset(st->reasons, 0, sizeof(st->reasons));
    memset(st->top_at, 0, sizeof(st->top_at));
    memset(st->top_len, 0, sizeof(st->top_len));
}

static PyObject *Scanner_feed(Scanner *self, PyObject *args) {
    Py_buffer view;
    int is_array;
    PyObject *marker = Py_None;
    long long first_order = 0;
    Py_ssize_t rest = -1;
    const char *marker_s = NULL;
    Py_ssize_t marker_len = 0;
    State *st = &self->st;
    if (!PyArg_ParseTuple(args, "y*p|OLn", &view, &is_array, &marker, &first_order, &rest)) return NULL;
    if (marker != Py_None && !(marker_s = PyUnicode_AsUTF8AndSize(marker, &marker_len))) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t rows_before = st->n_rows, raw_before = st->raw_len;
    /* room for the document's rows up front, at the bytes per row seen so far (growing by copies cost
     * a tenth of the scan; reserving too much, memory: a compact trace has 3x the rows per MB). Once a
     * document has given the bytes per row, and the file's size is known (`rest`: the bytes from this
     * document's start to the file's end), room for the rows still to come before the caller takes
     * them (the rest of the file, or of the batch: up to `batch_rows` and this document's), so the
     * rows of the next documents never move. On the 8 x 35 MB A100 set that is a fifth fewer page
     * faults than growing by copies, or than room for the whole file (blocks of one size are reused
     * batch after batch; larger ones are mapped afresh each time). The margin is
     * added only when the estimate without it no longer fits: re-estimated at every document, it
     * would otherwise outgrow its own margin and double the room (a copy of every row). */
    Py_ssize_t per_row = st->rows_seen ? st->bytes_seen / st->rows_seen : 256;
    if (per_row < 16) per_row = 16;
    Py_ssize_t expect = view.len / per_row;
    if (st->rows_seen && rest > view.len) {
        Py_ssize_t more = rest / per_row;
        if (st->batch_rows && more > st->batch_rows - st->n_rows + expect) more = st->batch_rows - st->n_rows + expect;
        if (more > expect) expect = more;
    }
    if (st->n_rows + expect + 64 > st->cap_rows && reserve_rows(st, st->n_rows + expect * 9 / 8 + 64)) {
        PyBuffer_Release(&view);
        return NULL;
    }
    st->plain = 0;
    st->first_order = first_order;
    start_doc(st, &view);
    int rc = parse_doc(st, is_array);
    if (rc == RESTART) {
        truncate_rows(st, rows_before);
        st->raw_len = raw_before;
        st->plain = 1;
        start_doc(st, &view);
        rc = parse_doc(st, is_array);
    }
    PyObject *res = NULL;
    int ended = 0;
    if (rc == 0 && marker_s) ended = drop_marker(st, marker_s, marker_len, rows_before);
    if (rc == 0) {
        res = piece_result(st, ended, st->n_rows - rows_before);
        if (res) {
            st->bytes_seen += view.len;
            st->rows_seen += st->n_rows - rows_before;
            st->last_rows = rows_before;
            st->last_raw = raw_before;
            st->can_drop = 1;
        }
    } else if (!PyErr_Occurred()) {
        res = PyUnicode_FromString(st->fail ? st->fail : "unsupported");
    }
    if (rc || !res) { /* nothing of a declined document stays (its new strings are unused, and harmless) */
        truncate_rows(st, rows_before);
        st->raw_len = raw_before;
    }
    st->base = st->p = st->end = NULL;
    PyBuffer_Release(&view);
    return res;
}

static PyObject *Scanner_drop_last(Scanner *self, PyObject *noargs) {
    State *st = &self->st;
    if (st->can_drop) {
        truncate_rows(st, st->last_rows);
        st->raw_len = st->last_raw;
        st->can_drop = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *Scanner_take(Scanner *self, PyObject *noargs) {
    State *st = &self->st;
    Rows *rows = PyObject_New(Rows, &RowsType), *strings = PyObject_New(Rows, &RowsType);
    if (!rows || !strings) { Py_XDECREF(rows); Py_XDECREF(strings); return NULL; }
    rows->array.release = strings->array.release = NULL;
    rows->length = st->n_rows;
    strings->length = st->n_strings;
    rows->strings = 0;
    strings->strings = 1;
    if (take_rows(st, &rows->array, &strings->array)) { Py_DECREF(rows); Py_DECREF(strings); return NULL; }
    return Py_BuildValue("(NN)", rows, strings);
}

static PyMethodDef SCANNER_METHODS[] = {
    {"feed", (PyCFunction)Scanner_feed, METH_VARARGS,
     "feed(document, is_array, marker=None, first_order=0, rest=-1) -> (n_events, n_kept, skipped, top, ended, rows)\n"
     "or the reason it is declined (str).\n\n"
     "Adds an accepted document's X/B/E/M rows; a declined one adds nothing. Its X/B/E rows are\n"
     "numbered (`order`) from first_order. top: {key: (offset, length)} of the top-level keys read, in\n"
     "the document. ended: the last event was an M event named `marker` (a str), and it was left out.\n"
     "rows: the rows it added (X/B/E and M). rest: the bytes from the document's start to the file's end\n"
     "(-1: unknown), to reserve room for the file's rows at once."},
    {"drop_last", (PyCFunction)Scanner_drop_last, METH_NOARGS,
     "drop_last() -> None: forget the last accepted document (once)."},
    {"take", (PyCFunction)Scanner_take, METH_NOARGS,
     "take() -> (rows, strings): the rows so far, typed, in COLUMNS order (strings utf8, cat and name\n"
     "dictionary-encoded, ids and times int64, has_args bool, raw args values binary: their JSON text; order\n"
     "-1 on M rows), and the interned strings (utf8: every string of the rows, the dictionary); the scanner\n"
     "then holds none."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracediag.ingest._chromescan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(batch_rows=0): reads Chrome-trace JSON documents (a file, or its pieces in order) into one\n"
              "set of columns. batch_rows: the caller takes the rows once they reach about this many (0: unknown),\n"
              "so room is reserved for no more.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = SCANNER_METHODS,
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_chromescan", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__chromescan(void) {
    memset(KEYS_BY_LEN, -1, sizeof(KEYS_BY_LEN));
    for (int a = 0; a < N_ARG_KEYS; a++) {
        size_t n = strlen(ARG_KEYS[a].key), k = 0;
        while (KEYS_BY_LEN[n][k] >= 0) k++;
        if (n >= MAX_KEY_LEN || k >= 7) {
            PyErr_SetString(PyExc_SystemError, "_chromescan: args key table");
            return NULL;
        }
        KEYS_BY_LEN[n][k] = (signed char)a;
        IS_ARGS_COL[ARG_KEYS[a].col] = 1;
        if (ARG_KEYS[a].how == A_RAW) IS_ARGS_COL[ARG_KEYS[a].col + 1] = 1;
    }
    for (int c = 0; c < 256; c++) {
        STRING_STOP[c] = c == '"' || c == '\\' || c < 0x20 || c >= 0x80;
        IS_WS[c] = c == ' ' || c == '\n' || c == '\r' || c == '\t';
        BITS_SET[c] = (unsigned char)((c & 1) + BITS_SET[c >> 1]); /* c >> 1 is filled already */
    }
    fast_array_tables();
    if (PyType_Ready(&ScannerType) < 0 || PyType_Ready(&RowsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (!m) return NULL;
    PyObject *names = PyTuple_New(N_OUT);
    if (!names) { Py_DECREF(m); return NULL; }
    for (int c = 0; c < N_OUT; c++) PyTuple_SET_ITEM(names, c, PyUnicode_FromString(OUT_COLS[c].name));
    if (PyModule_AddObject(m, "COLUMNS", names)) { Py_DECREF(names); Py_DECREF(m); return NULL; }
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType)) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

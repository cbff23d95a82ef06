/* The rows of the .xlsx writer's sheet XML, and of its CSV, joined in one pass.
 *
 * cells.encode_rows works a chunk of rows out a column at a time: per column one text
 * per row, or one text for every row, or a code per row into a few texts, or, for a run
 * of float columns, the text of the whole block (float_text.py). A row of the file is those
 * texts one after another. In Python that took a zip, a chain, a join and an encode, and
 * for each block of numbers two str.replace and a split first (the block's commas
 * becoming the XML between its cells): about half of the 1.7 s that the main sheet of
 * bench/compare.py's 100k-entry pair took to encode. Here each byte is copied once, into
 * the bytes object returned (sized first: no growing copies of a 4 MB chunk).
 *
 * join_rows(parts, m, sep, end) -> bytes
 *   parts: a sequence of parts, each one of
 *     list of m str        row r writes parts[r]
 *     str                  every row writes it
 *     int                  row r writes the number int + r (a row's number, from 0)
 *     (texts, codes)       a list of str and bytes of m codes (1, 2 or 4 bytes each,
 *                          native order: len(codes) // m says which): row r writes
 *                          texts[codes[r]] (a column of few distinct values, or the
 *                          rows' style, without a list of m texts)
 *     (bytes, openings)    a block of numbers, the text of an m x k float64 array
 *                          ("[[a,b],[c,d]]", float_text.py): row r writes each number x of its row as
 *                          opening + "><v>" + x + "</v></c>", or opening + "/>" where
 *                          x is null (a NaN); openings: a list of m str, one str, or
 *                          (texts, codes) as above
 *     (bytes, None)        the same block as CSV fields: row r writes its numbers,
 *                          comma-separated, null as nothing
 *     (Block, openings), (Block, None)
 *                          the same, the block's rows' text made by _cfloat (see
 *                          _cfloat.h) when the rows are joined, by the sheet's and the
 *                          CSV's joins together, without the GIL (the module's
 *                          "block_parts" says whether _cfloat was there to take them)
 *   sep: written between the parts of a row; end: after each row. Text is UTF-8.
 *
 * cells.join_rows_py is the same function in Python (used where this was not built);
 * tests/test_xlsx_join.py checks that both give the same bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_cfloat.h"

static const probe_cfloat_api *cfloat;        /* NULL where _cfloat was not built */

#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#define HAVE_SSE2_SCAN 1
#endif

enum { P_LIST, P_CONST, P_CELLS, P_FIELDS, P_PICK, P_COUNT };

typedef struct {                /* texts picked per row by a code */
    const unsigned char *codes;
    int width;                  /* bytes a code: 1, 2 or 4 */
    Py_ssize_t n;               /* how many texts (0: no pick) */
    const char **ptr;           /* each text's UTF-8 */
    Py_ssize_t *len;
} pick_t;

typedef struct {
    int kind;
    const char **texts;       /* P_LIST: each row's text; P_CELLS: each row's opening, or NULL */
    Py_ssize_t *lens;
    Py_ssize_t size;          /* P_LIST: the bytes of all its texts */
    const char *text;         /* P_CONST: the text; P_CELLS / P_FIELDS: the block */
    Py_ssize_t len;
    const char *open;         /* P_CELLS with one opening */
    Py_ssize_t open_len;
    pick_t pick;              /* P_PICK: the texts; P_CELLS: the openings, where picked */
    long long first;          /* P_COUNT: row 0's number */
    PyObject *block;          /* P_CELLS / P_FIELDS of a Block (len: its rows' bytes at most) */
} part_t;

typedef struct {              /* the result, written in place: sized first, never grown */
    char *buf;
    Py_ssize_t len, cap;
} out_t;

enum { J_OK, J_BLOCK, J_SIZE };   /* what a copy without the GIL found */

/* Rows: parts read and checked (their UTF-8 made), to be joined later, on any thread. */
typedef struct {
    PyObject_HEAD
    PyObject *parts;          /* PySequence_Fast of the parts: it holds every text read */
    PyObject *sep_obj, *end_obj;
    PyObject *out;            /* the result's bytes, made with the rows (NULL once joined) */
    Py_ssize_t size;          /* the bytes the rows take at most */
    part_t *ps;
    Py_ssize_t np, m;
    const char *sep, *end;
    Py_ssize_t sep_len, end_len;
} RowsObject;

/* n bytes from s to d: the short texts of a row (a cell's opening, a number, a name)
 * without a call to memcpy each (a fifth of the join was libc's memmove and its PLT). */
static inline void copy_small(char *d, const char *s, Py_ssize_t n) {
    if (n >= 8) {
        if (n <= 16) {
            uint64_t a, b;
            memcpy(&a, s, 8);
            memcpy(&b, s + n - 8, 8);
            memcpy(d, &a, 8);
            memcpy(d + n - 8, &b, 8);
        } else if (n <= 32) {
            char a[16], b[16];
            memcpy(a, s, 16);
            memcpy(b, s + n - 16, 16);
            memcpy(d, a, 16);
            memcpy(d + n - 16, b, 16);
        } else {
            memcpy(d, s, (size_t)n);
        }
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        memcpy(d, &a, 4);
        memcpy(d + n - 4, &b, 4);
    } else if (n > 0) {
        d[0] = s[0];
        d[n >> 1] = s[n >> 1];
        d[n - 1] = s[n - 1];
    }
}

static inline int put(out_t *o, const char *s, Py_ssize_t n) {
    if (o->len + n > o->cap)
        return J_SIZE;
    copy_small(o->buf + o->len, s, n);
    o->len += n;
    return J_OK;
}

static const char *utf8_of(PyObject *s, Py_ssize_t *n) {
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "join_rows: a row's text must be str, not %.100s",
                     Py_TYPE(s)->tp_name);
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(s, n);
}

static inline Py_ssize_t code_at(const pick_t *k, Py_ssize_t r) {
    if (k->width == 1)
        return k->codes[r];
    if (k->width == 2) {
        uint16_t c;
        memcpy(&c, k->codes + 2 * r, 2);
        return c;
    }
    uint32_t c;
    memcpy(&c, k->codes + 4 * r, 4);
    return (Py_ssize_t)c;
}

static int put_count(out_t *o, long long x) {
    char digits[24];
    int k = (int)sizeof(digits);
    do {
        digits[--k] = (char)('0' + x % 10);
        x /= 10;
    } while (x);
    return put(o, digits + k, (Py_ssize_t)sizeof(digits) - k);
}

/* Where the number at t[i] ends: the first ',' or ']' from i on (n if none). */
static inline Py_ssize_t number_end(const char *t, Py_ssize_t i, Py_ssize_t n) {
#ifdef HAVE_SSE2_SCAN
    const __m128i comma = _mm_set1_epi8(','), close = _mm_set1_epi8(']');
    while (i + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(t + i));
        int mask = _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, comma), _mm_cmpeq_epi8(v, close)));
        if (mask)
            return i + __builtin_ctz((unsigned)mask);
        i += 16;
    }
#endif
    while (i < n && t[i] != ',' && t[i] != ']')
        i++;
    return i;
}

/* One row's numbers ("a,b,null": no brackets) as cells (opening given: each number x as
 * opening + "><v>" + x + "</v></c>", a null as opening + "/>") or as CSV fields (the
 * text as it is, a null as nothing). */
static int put_numbers(out_t *o, const char *t, Py_ssize_t n, const char *open, Py_ssize_t open_len) {
    if (open == NULL && (n == 0 || memchr(t, 'n', (size_t)n) == NULL))
        return put(o, t, n);
    Py_ssize_t i = 0;
    int first = 1;
    while (i < n) {
        Py_ssize_t start = i;
        i = number_end(t, i, n);
        Py_ssize_t len = i - start;
        int null = len == 4 && memcmp(t + start, "null", 4) == 0;
        if (open != NULL) {
            if (o->len + open_len + 12 + len > o->cap)
                return J_SIZE;
            char *w = o->buf + o->len;
            copy_small(w, open, open_len);
            w += open_len;
            if (null) {
                memcpy(w, "/>", 2);
                w += 2;
            } else {
                memcpy(w, "><v>", 4);
                copy_small(w + 4, t + start, len);
                memcpy(w + 4 + len, "</v></c>", 8);
                w += 12 + len;
            }
            o->len = w - o->buf;
        } else {
            if (!first && put(o, ",", 1) != J_OK)
                return J_SIZE;
            if (!null && put(o, t + start, len) != J_OK)
                return J_SIZE;
        }
        first = 0;
        i++;                                         /* past the comma */
    }
    return J_OK;
}

/* One row of a block: from a Block, its row r; from a block's text, the row that starts
 * at *pos (moved past it). */
static int put_block_row(out_t *o, const part_t *p, Py_ssize_t r, Py_ssize_t *pos, const char *open,
                         Py_ssize_t open_len) {
    if (p->block != NULL) {
        Py_ssize_t len;
        const char *row = cfloat->row(p->block, r, &len);
        return put_numbers(o, row, len, open, open_len);
    }
    const char *t = p->text;
    Py_ssize_t i = *pos, n = p->len;
    int opened = 0;                                  /* "[[" before the first row, ",[" between */
    while (i < n && (t[i] == '[' || t[i] == ',')) {
        opened = t[i] == '[';
        i++;
    }
    if (i >= n || !opened)
        return J_BLOCK;
    const char *close = memchr(t + i, ']', (size_t)(n - i));
    if (close == NULL)
        return J_BLOCK;
    *pos = close - t + 1;                            /* past the row's "]" */
    return put_numbers(o, t + i, close - (t + i), open, open_len);
}

static int setup_pick(pick_t *k, PyObject *texts, PyObject *codes, Py_ssize_t m) {
    Py_ssize_t nb = PyBytes_GET_SIZE(codes);
    k->width = m == 0 ? 1 : nb == m ? 1 : nb == 2 * m ? 2 : nb == 4 * m ? 4 : 0;
    if (k->width == 0) {
        PyErr_Format(PyExc_ValueError, "join_rows: %zd bytes of codes for %zd rows", nb, m);
        return -1;
    }
    k->codes = (const unsigned char *)PyBytes_AS_STRING(codes);
    k->n = PyList_GET_SIZE(texts);
    k->ptr = PyMem_Calloc((size_t)(k->n ? k->n : 1), sizeof(*k->ptr));
    k->len = PyMem_Calloc((size_t)(k->n ? k->n : 1), sizeof(*k->len));
    if (k->ptr == NULL || k->len == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < k->n; j++)
        if ((k->ptr[j] = utf8_of(PyList_GET_ITEM(texts, j), &k->len[j])) == NULL)
            return -1;
    for (Py_ssize_t r = 0; r < m; r++)
        if (code_at(k, r) >= k->n) {
            PyErr_Format(PyExc_ValueError, "join_rows: code %zd of row %zd is past its %zd texts",
                         code_at(k, r), r, k->n);
            return -1;
        }
    return 0;
}

/* Each row's text of a list of m str, as UTF-8 (made here, with the GIL). */
static int setup_texts(part_t *p, PyObject *list, Py_ssize_t m) {
    p->texts = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(*p->texts));
    p->lens = PyMem_Malloc((size_t)(m ? m : 1) * sizeof(*p->lens));
    if (p->texts == NULL || p->lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    p->size = 0;
    for (Py_ssize_t r = 0; r < m; r++) {
        if ((p->texts[r] = utf8_of(PyList_GET_ITEM(list, r), &p->lens[r])) == NULL)
            return -1;
        p->size += p->lens[r];
    }
    return 0;
}

static int is_pick(PyObject *item) {
    return PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2 && PyList_Check(PyTuple_GET_ITEM(item, 0))
           && PyBytes_Check(PyTuple_GET_ITEM(item, 1));
}

static int setup_part(part_t *p, PyObject *item, Py_ssize_t m) {
    if (PyList_Check(item)) {
        if (PyList_GET_SIZE(item) != m) {
            PyErr_Format(PyExc_ValueError, "join_rows: a part has %zd texts for %zd rows",
                         PyList_GET_SIZE(item), m);
            return -1;
        }
        p->kind = P_LIST;
        return setup_texts(p, item, m);
    }
    if (PyLong_CheckExact(item)) {
        p->kind = P_COUNT;
        p->first = PyLong_AsLongLong(item);
        if (p->first == -1 && PyErr_Occurred())
            return -1;
        if (p->first < 0 || p->first > ((long long)1 << 62) - m) {
            PyErr_SetString(PyExc_ValueError, "join_rows: a count starts at 0 to 2**62");
            return -1;
        }
        return 0;
    }
    if (PyUnicode_Check(item)) {
        p->kind = P_CONST;
        p->text = PyUnicode_AsUTF8AndSize(item, &p->len);
        return p->text == NULL ? -1 : 0;
    }
    if (is_pick(item)) {
        p->kind = P_PICK;
        return setup_pick(&p->pick, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), m);
    }
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2
        && (PyBytes_Check(PyTuple_GET_ITEM(item, 0))
            || (cfloat != NULL && cfloat->is_block(PyTuple_GET_ITEM(item, 0))))) {
        PyObject *text = PyTuple_GET_ITEM(item, 0), *openings = PyTuple_GET_ITEM(item, 1);
        if (PyBytes_Check(text)) {
            p->text = PyBytes_AS_STRING(text);
            p->len = PyBytes_GET_SIZE(text);
        } else {
            if (cfloat->rows(text) < m) {            /* (a text with too few rows: J_BLOCK when joined) */
                PyErr_Format(PyExc_ValueError, "join_rows: a block holds %zd rows for %zd rows",
                             cfloat->rows(text), m);
                return -1;
            }
            p->block = text;                         /* its text: when joined */
            p->len = cfloat->bound(text);
        }
        if (openings == Py_None) {
            p->kind = P_FIELDS;
            return 0;
        }
        p->kind = P_CELLS;
        if (PyUnicode_Check(openings)) {
            p->open = PyUnicode_AsUTF8AndSize(openings, &p->open_len);
            return p->open == NULL ? -1 : 0;
        }
        if (PyList_Check(openings) && PyList_GET_SIZE(openings) == m)
            return setup_texts(p, openings, m);
        if (is_pick(openings))
            return setup_pick(&p->pick, PyTuple_GET_ITEM(openings, 0), PyTuple_GET_ITEM(openings, 1), m);
    }
    PyErr_SetString(PyExc_TypeError, "join_rows: a part is a list of m str, a str, an int, (texts, codes), "
                    "(bytes or Block, openings) or (bytes or Block, None)");
    return -1;
}

/* How many commas t holds: a block's numbers, less one. */
static Py_ssize_t count_commas(const char *t, Py_ssize_t n) {
    Py_ssize_t total = 0, i = 0;
#ifdef HAVE_SSE2_SCAN
    const __m128i comma = _mm_set1_epi8(',');
    for (; i + 16 <= n; i += 16)
        total += __builtin_popcount((unsigned)_mm_movemask_epi8(
            _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(t + i)), comma)));
#endif
    for (; i < n; i++)
        total += t[i] == ',';
    return total;
}

/* Bytes a part writes in all: exact, but for a block of cells (at most its text and, per
 * number, its longest opening and the cell's "><v></v></c>"). Reads no Python object. */
static Py_ssize_t part_size(const part_t *p, Py_ssize_t m) {
    Py_ssize_t total = 0;
    switch (p->kind) {
    case P_LIST:
        return p->size;
    case P_CONST:
        return m * p->len;
    case P_PICK:
        for (Py_ssize_t r = 0; r < m; r++)
            total += p->pick.len[code_at(&p->pick, r)];
        return total;
    case P_FIELDS:
        return p->len;
    case P_COUNT:
        return 20 * m;                               /* digits of a number below 2**63 */
    default: {                                       /* P_CELLS */
        Py_ssize_t longest = p->open_len, numbers = 1;
        if (p->texts != NULL)
            for (Py_ssize_t r = 0; r < m; r++)
                longest = p->lens[r] > longest ? p->lens[r] : longest;
        for (Py_ssize_t j = 0; j < p->pick.n; j++)
            longest = p->pick.len[j] > longest ? p->pick.len[j] : longest;
        numbers = p->block != NULL ? cfloat->count(p->block) : numbers + count_commas(p->text, p->len);
        return p->len + numbers * (longest + 12);
    }
    }
}

/* The rows into o (sized by part_size): J_OK, or what went wrong. Reads no Python object,
 * so it runs without the GIL. */
static int copy_rows(const RowsObject *self, out_t *o, Py_ssize_t *pos) {
    Py_ssize_t m = self->m, np_ = self->np;
    for (Py_ssize_t k = 0; k < np_; k++)
        if (self->ps[k].block != NULL)
            cfloat->make(self->ps[k].block);
    for (Py_ssize_t r = 0; r < m; r++) {
        for (Py_ssize_t k = 0; k < np_; k++) {
            const part_t *p = &self->ps[k];
            if (k && self->sep_len && put(o, self->sep, self->sep_len) != J_OK)
                return J_SIZE;
            int rc;
            Py_ssize_t n;
            switch (p->kind) {
            case P_LIST:
                rc = put(o, p->texts[r], p->lens[r]);
                break;
            case P_CONST:
                rc = put(o, p->text, p->len);
                break;
            case P_COUNT:
                rc = put_count(o, p->first + r);
                break;
            case P_PICK:
                n = code_at(&p->pick, r);
                rc = put(o, p->pick.ptr[n], p->pick.len[n]);
                break;
            case P_CELLS:
                if (p->texts != NULL) {
                    rc = put_block_row(o, p, r, &pos[k], p->texts[r], p->lens[r]);
                } else if (p->pick.n) {
                    n = code_at(&p->pick, r);
                    rc = put_block_row(o, p, r, &pos[k], p->pick.ptr[n], p->pick.len[n]);
                } else {
                    rc = put_block_row(o, p, r, &pos[k], p->open, p->open_len);
                }
                break;
            default:
                rc = put_block_row(o, p, r, &pos[k], NULL, 0);
            }
            if (rc != J_OK)
                return rc;
        }
        if (self->end_len && put(o, self->end, self->end_len) != J_OK)
            return J_SIZE;
    }
    return J_OK;
}

static void Rows_dealloc(RowsObject *self) {
    if (self->ps != NULL) {
        for (Py_ssize_t k = 0; k < self->np; k++) {
            PyMem_Free(self->ps[k].pick.ptr);
            PyMem_Free(self->ps[k].pick.len);
            PyMem_Free((void *)self->ps[k].texts);
            PyMem_Free(self->ps[k].lens);
        }
        PyMem_Free(self->ps);
    }
    Py_XDECREF(self->parts);
    Py_XDECREF(self->out);
    Py_XDECREF(self->sep_obj);
    Py_XDECREF(self->end_obj);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The bytes the rows take at most. */
static Py_ssize_t rows_size(const RowsObject *self) {
    Py_ssize_t size = self->m * (self->end_len + (self->np ? self->np - 1 : 0) * self->sep_len);
    for (Py_ssize_t k = 0; k < self->np; k++)
        size += part_size(&self->ps[k], self->m);
    return size;
}

/* Rows.join() -> bytes: the rows, copied with the GIL released (the deflate threads and
 * the encoding of the next rows go on meanwhile) into the bytes made with them. */
static PyObject *Rows_join(RowsObject *self, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t size = self->size;
    PyObject *bytes = self->out;
    self->out = NULL;
    if (bytes == NULL && (bytes = PyBytes_FromStringAndSize(NULL, size + 1)) == NULL)    /* joined again */
        return NULL;
    Py_ssize_t *pos = PyMem_Calloc((size_t)(self->np ? self->np : 1), sizeof(Py_ssize_t));
    if (pos == NULL) {
        Py_DECREF(bytes);
        return PyErr_NoMemory();
    }
    out_t o = {PyBytes_AS_STRING(bytes), 0, size + 1};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = copy_rows(self, &o, pos);
    Py_END_ALLOW_THREADS
    PyMem_Free(pos);
    if (rc != J_OK) {
        Py_DECREF(bytes);
        if (rc == J_BLOCK)
            PyErr_SetString(PyExc_ValueError, "join_rows: a block's text holds fewer rows than m");

        else
            PyErr_SetString(PyExc_SystemError, "join_rows: the rows outgrew their size");
        return NULL;
    }
    if (_PyBytes_Resize(&bytes, o.len) < 0)
        return NULL;
    return bytes;
}

static PyMethodDef Rows_methods[] = {
    {"join", (PyCFunction)Rows_join, METH_NOARGS,
     "join() -> bytes: the rows, each its parts' texts in order (the GIL released meanwhile)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "probe.compare.xlsx._cjoin.Rows",
    .tp_basicsize = sizeof(RowsObject),
    .tp_dealloc = (destructor)Rows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Rows to join: made by rows(parts, m, sep, end), joined by join().",
    .tp_methods = Rows_methods,
};

/* rows(parts, m, sep, end) -> Rows: the parts checked and their texts' UTF-8 made (an
 * error, a lone surrogate's UnicodeEncodeError too, is raised here), to be joined later
 * on any thread. The parts must not change until then. The result's bytes are made here,
 * by the encoding thread: made by a writer thread, glibc kept up to a trim threshold of
 * freed memory in that thread's own heap (malloc_trim does not give back a thread
 * heap's top), ~30 MB more at the 100k-entry pair's peak (its pages are touched only
 * when joined). */
static PyObject *rows(PyObject *self, PyObject *args) {
    PyObject *parts_arg, *sep, *end;
    Py_ssize_t m;
    if (!PyArg_ParseTuple(args, "OnUU:rows", &parts_arg, &m, &sep, &end))
        return NULL;
    if (m < 0) {
        PyErr_SetString(PyExc_ValueError, "join_rows: m must be >= 0");
        return NULL;
    }
    RowsObject *r = PyObject_New(RowsObject, &RowsType);
    if (r == NULL)
        return NULL;
    r->ps = NULL;
    r->out = NULL;
    r->np = 0;
    r->m = m;
    Py_INCREF(sep);
    Py_INCREF(end);
    r->sep_obj = sep;
    r->end_obj = end;
    r->parts = PySequence_Fast(parts_arg, "join_rows: parts must be a sequence");
    if (r->parts == NULL)
        goto fail;
    if ((r->sep = PyUnicode_AsUTF8AndSize(sep, &r->sep_len)) == NULL
        || (r->end = PyUnicode_AsUTF8AndSize(end, &r->end_len)) == NULL)
        goto fail;
    Py_ssize_t np_ = PySequence_Fast_GET_SIZE(r->parts);
    r->ps = PyMem_Calloc((size_t)(np_ ? np_ : 1), sizeof(part_t));
    if (r->ps == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    r->np = np_;
    for (Py_ssize_t k = 0; k < np_; k++)
        if (setup_part(&r->ps[k], PySequence_Fast_GET_ITEM(r->parts, k), m) < 0)
            goto fail;
    Py_BEGIN_ALLOW_THREADS
    r->size = rows_size(r);
    Py_END_ALLOW_THREADS
    /* + 1: a bytes object of its own, never the shared empty one */
    if ((r->out = PyBytes_FromStringAndSize(NULL, r->size + 1)) == NULL)
        goto fail;
    return (PyObject *)r;
fail:
    Py_DECREF(r);
    return NULL;
}

static PyObject *join_rows(PyObject *self, PyObject *args) {
    PyObject *r = rows(self, args);
    if (r == NULL)
        return NULL;
    PyObject *out = Rows_join((RowsObject *)r, NULL);
    Py_DECREF(r);
    return out;
}

/* Codes as bytes of 1, 2 or 4 bytes a code (the fewest that hold k distinct values). */
static PyObject *code_bytes(const uint32_t *all, Py_ssize_t n, Py_ssize_t k) {
    int width = k <= 1 << 8 ? 1 : k <= 1 << 16 ? 2 : 4;
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, n * width);
    if (bytes == NULL)
        return NULL;
    char *b = PyBytes_AS_STRING(bytes);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (width == 1) {
            b[i] = (char)(unsigned char)all[i];
        } else if (width == 2) {
            uint16_t c = (uint16_t)all[i];
            memcpy(b + 2 * i, &c, 2);
        } else {
            memcpy(b + 4 * i, &all[i], 4);
        }
    }
    return bytes;
}

typedef struct {                  /* a distinct tail: its characters in a 1-byte text */
    const Py_UCS1 *data;
    Py_ssize_t len;
    uint64_t hash;
    uint32_t code;
    int used;
} tail_t;

static uint64_t hash_bytes(const Py_UCS1 *s, Py_ssize_t n) {      /* FNV-1a */
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

/* tail_codes(texts, heads, which) -> (distinct, codes) or None
 *   texts: a list of str; heads: a list; which: bytes of one int32 per text (native
 *   order), the index of its head in heads (negative: from the end, as Python indexes).
 *   Each text's tail, text[len(head):], coded as codes() codes them: the distinct tails
 *   in order of first appearance and per text the index of its tail. None where a text
 *   or its head is not a str or the text does not start with its head. The page's
 *   row names after their call's name (".input.0"): 350k rows of the 100k-entry pair,
 *   a few hundred tails, each tail found by its characters (no str made per row) where
 *   the texts are of 1-byte characters, else by a str of it.
 * cells.tail_codes_py is the same function in Python. */
static PyObject *tail_codes(PyObject *self, PyObject *args) {
    PyObject *texts, *heads, *which;
    if (!PyArg_ParseTuple(args, "O!O!O!:tail_codes", &PyList_Type, &texts, &PyList_Type, &heads,
                          &PyBytes_Type, &which))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(texts), nh = PyList_GET_SIZE(heads);
    if (PyBytes_GET_SIZE(which) != 4 * n) {
        PyErr_Format(PyExc_ValueError, "tail_codes: %zd bytes of heads' indices for %zd texts",
                     PyBytes_GET_SIZE(which), n);
        return NULL;
    }
    const char *w = PyBytes_AS_STRING(which);
    PyObject *distinct = PyList_New(0), *index = NULL, *out = NULL;
    uint32_t *all = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    Py_ssize_t cap = 1024;
    tail_t *table = PyMem_Calloc((size_t)cap, sizeof(tail_t));
    if (distinct == NULL || all == NULL || table == NULL) {
        if (distinct != NULL)
            PyErr_NoMemory();
        goto done;
    }
    int narrow = 1;                       /* every text of 1-byte characters: tails found by their bytes */
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *t = PyList_GET_ITEM(texts, r);
        if (!PyUnicode_Check(t)) {
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(t) < 0)
            goto done;
#endif
        if (PyUnicode_KIND(t) != PyUnicode_1BYTE_KIND)
            narrow = 0;
    }
    if (!narrow && (index = PyDict_New()) == NULL)
        goto done;
    for (Py_ssize_t r = 0; r < n; r++) {
        int32_t k;
        memcpy(&k, w + 4 * r, 4);
        Py_ssize_t at = k < 0 ? k + nh : k;
        if (at < 0 || at >= nh) {
            PyErr_SetString(PyExc_IndexError, "tail_codes: a head's index is out of range");
            goto done;
        }
        PyObject *t = PyList_GET_ITEM(texts, r), *head = PyList_GET_ITEM(heads, at);
        if (!PyUnicode_Check(head)) {
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
        Py_ssize_t start = PyUnicode_GET_LENGTH(head), len = PyUnicode_GET_LENGTH(t);
        int starts = PyUnicode_Tailmatch(t, head, 0, PY_SSIZE_T_MAX, -1);    /* str.startswith */
        if (starts < 0)
            goto done;
        if (!starts) {
            out = Py_None;
            Py_INCREF(out);
            goto done;
        }
        if (!narrow) {                    /* wide characters: a str of the tail, looked up */
            PyObject *tail = PyUnicode_Substring(t, start, len);
            if (tail == NULL)
                goto done;
            PyObject *code = PyDict_GetItemWithError(index, tail);
            if (code == NULL) {
                Py_ssize_t c = PyList_GET_SIZE(distinct);
                if (PyErr_Occurred() || (code = PyLong_FromSsize_t(c)) == NULL) {
                    Py_DECREF(tail);
                    goto done;
                }
                int failed = PyDict_SetItem(index, tail, code) < 0 || PyList_Append(distinct, tail) < 0;
                Py_DECREF(code);
                Py_DECREF(tail);
                if (failed)
                    goto done;
                all[r] = (uint32_t)c;
            } else {
                all[r] = (uint32_t)PyLong_AsSsize_t(code);
                Py_DECREF(tail);
            }
            continue;
        }
        const Py_UCS1 *data = PyUnicode_1BYTE_DATA(t) + start;
        Py_ssize_t tl = len - start;
        uint64_t h = hash_bytes(data, tl);
        Py_ssize_t slot = (Py_ssize_t)(h & (uint64_t)(cap - 1));
        while (table[slot].used && !(table[slot].hash == h && table[slot].len == tl
                                     && memcmp(table[slot].data, data, (size_t)tl) == 0))
            slot = (slot + 1) & (cap - 1);
        if (!table[slot].used) {
            Py_ssize_t c = PyList_GET_SIZE(distinct);
            if (c >= (Py_ssize_t)UINT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "tail_codes: too many distinct tails");
                goto done;
            }
            PyObject *tail = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, data, tl);
            if (tail == NULL)
                goto done;
            int failed = PyList_Append(distinct, tail) < 0;
            Py_DECREF(tail);
            if (failed)
                goto done;
            table[slot] = (tail_t){data, tl, h, (uint32_t)c, 1};
            if (2 * (c + 1) > cap) {                 /* at most half full: grown, each tail placed again */
                Py_ssize_t bigger = cap * 2;
                tail_t *grown = PyMem_Calloc((size_t)bigger, sizeof(tail_t));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                for (Py_ssize_t j = 0; j < cap; j++) {
                    if (!table[j].used)
                        continue;
                    Py_ssize_t s = (Py_ssize_t)(table[j].hash & (uint64_t)(bigger - 1));
                    while (grown[s].used)
                        s = (s + 1) & (bigger - 1);
                    grown[s] = table[j];
                }
                PyMem_Free(table);
                table = grown;
                cap = bigger;
            }
            all[r] = (uint32_t)c;
        } else {
            all[r] = table[slot].code;
        }
    }
    PyObject *bytes = code_bytes(all, n, PyList_GET_SIZE(distinct));
    if (bytes != NULL) {
        out = PyTuple_Pack(2, distinct, bytes);
        Py_DECREF(bytes);
    }
done:
    PyMem_Free(all);
    PyMem_Free(table);
    Py_XDECREF(index);
    Py_XDECREF(distinct);
    return out;
}

static PyMethodDef methods[] = {
    {"join_rows", join_rows, METH_VARARGS,
     "join_rows(parts, m, sep, end) -> bytes: m rows, each its parts' texts in order"},
    {"rows", rows, METH_VARARGS,
     "rows(parts, m, sep, end) -> Rows: the parts checked, to be joined later (Rows.join())"},
    {"tail_codes", tail_codes, METH_VARARGS,
     "tail_codes(texts, heads, which) -> (distinct, codes) or None: each text's tail after its head, coded"},
    {NULL, NULL, 0, NULL},
};

/* _cfloat's functions, or NULL where it was not built (bytes blocks only). Imported by its
 * full name: PyCapsule_Import reads the package's attributes, which are not set while the
 * package imports this module. */
static const probe_cfloat_api *import_cfloat(void) {
    PyObject *mod = PyImport_ImportModule("probe.compare.xlsx._cfloat");
    PyObject *capsule = mod == NULL ? NULL : PyObject_GetAttrString(mod, "api");
    const probe_cfloat_api *api = capsule == NULL ? NULL : PyCapsule_GetPointer(capsule, PROBE_CFLOAT_CAPSULE);
    Py_XDECREF(capsule);
    Py_XDECREF(mod);
    if (api == NULL)
        PyErr_Clear();
    return api;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cjoin", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cjoin(void) {
    if (PyType_Ready(&RowsType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    Py_INCREF(&RowsType);
    if (PyModule_AddObject(mod, "Rows", (PyObject *)&RowsType) < 0) {
        Py_DECREF(&RowsType);
        Py_DECREF(mod);
        return NULL;
    }
    cfloat = import_cfloat();
    if (PyModule_AddObject(mod, "block_parts", PyBool_FromLong(cfloat != NULL)) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}

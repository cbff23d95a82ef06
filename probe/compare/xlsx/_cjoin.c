/* The rows of the .xlsx writer's sheet XML, and of its CSV, joined in one pass.
 *
 * cells.encode_rows works a chunk of rows out a column at a time: per column one text
 * per row, or one text for every row, or a code per row into a few texts, or, for a run
 * of float columns, the text orjson made of the whole block. A row of the file is those
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
 *     (bytes, openings)    a block of numbers, orjson's text of an m x k float64 array
 *                          ("[[a,b],[c,d]]"): row r writes each number x of its row as
 *                          opening + "><v>" + x + "</v></c>", or opening + "/>" where
 *                          x is null (a NaN); openings: a list of m str, one str, or
 *                          (texts, codes) as above
 *     (bytes, None)        the same block as CSV fields: row r writes its numbers,
 *                          comma-separated, null as nothing
 *   sep: written between the parts of a row; end: after each row. Text is UTF-8.
 *
 * cells.join_rows_py is the same function in Python (used where this was not built);
 * tests/test_xlsx_join.py checks that both give the same bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
    PyObject *list;           /* P_LIST: the texts; P_CELLS: the openings, or NULL */
    const char *text;         /* P_CONST: the text; P_CELLS / P_FIELDS: the block */
    Py_ssize_t len;
    Py_ssize_t pos;           /* P_CELLS / P_FIELDS: where the next row starts */
    const char *open;         /* P_CELLS with one opening */
    Py_ssize_t open_len;
    pick_t pick;              /* P_PICK: the texts; P_CELLS: the openings, where picked */
    long long first;          /* P_COUNT: row 0's number */
} part_t;

typedef struct {              /* the result, written in place */
    PyObject *bytes;
    char *buf;
    Py_ssize_t len, cap;
} out_t;

static int reserve(out_t *o, Py_ssize_t need) {
    if (o->len + need <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : (Py_ssize_t)1 << 16;
    while (cap < o->len + need)
        cap *= 2;
    if (o->bytes == NULL)
        o->bytes = PyBytes_FromStringAndSize(NULL, cap);
    else if (_PyBytes_Resize(&o->bytes, cap) < 0)     /* frees it and sets it NULL */
        return -1;
    if (o->bytes == NULL)
        return -1;
    o->buf = PyBytes_AS_STRING(o->bytes);
    o->cap = cap;
    return 0;
}

static inline int put(out_t *o, const char *s, Py_ssize_t n) {
    if (reserve(o, n) < 0)
        return -1;
    memcpy(o->buf + o->len, s, (size_t)n);
    o->len += n;
    return 0;
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

static int block_error(void) {
    PyErr_SetString(PyExc_ValueError, "join_rows: a block's text holds fewer rows than m");
    return -1;
}

/* One row of a block: its numbers as cells (opening given) or as CSV fields. */
static int put_block_row(out_t *o, part_t *p, const char *open, Py_ssize_t open_len) {
    const char *t = p->text;
    Py_ssize_t i = p->pos, n = p->len;
    int opened = 0;                                  /* "[[" before the first row, ",[" between */
    while (i < n && (t[i] == '[' || t[i] == ',')) {
        opened = t[i] == '[';
        i++;
    }
    if (i >= n || !opened)
        return block_error();
    if (open == NULL) {                              /* fields: the row's text as it is, but nulls */
        const char *close = memchr(t + i, ']', (size_t)(n - i));
        if (close == NULL)
            return block_error();
        Py_ssize_t span = close - (t + i);
        if (span && memchr(t + i, 'n', (size_t)span) == NULL) {
            if (put(o, t + i, span) < 0)
                return -1;
            p->pos = i + span + 1;
            return 0;
        }
    }
    int first = 1;
    while (i < n && t[i] != ']') {
        Py_ssize_t start = i;
        while (i < n && t[i] != ',' && t[i] != ']')
            i++;
        if (i >= n)
            return block_error();
        Py_ssize_t len = i - start;
        int null = len == 4 && memcmp(t + start, "null", 4) == 0;
        if (open != NULL) {
            if (reserve(o, open_len + 12 + len) < 0)
                return -1;
            char *w = o->buf + o->len;
            memcpy(w, open, (size_t)open_len);
            w += open_len;
            if (null) {
                memcpy(w, "/>", 2);
                w += 2;
            } else {
                memcpy(w, "><v>", 4);
                memcpy(w + 4, t + start, (size_t)len);
                memcpy(w + 4 + len, "</v></c>", 8);
                w += 12 + len;
            }
            o->len = w - o->buf;
        } else {
            if (!first && put(o, ",", 1) < 0)
                return -1;
            if (!null && put(o, t + start, len) < 0)
                return -1;
        }
        first = 0;
        if (t[i] == ',')
            i++;
    }
    if (i >= n)
        return block_error();
    p->pos = i + 1;                                  /* past the row's "]" */
    return 0;
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
        p->list = item;
        return 0;
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
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2 && PyBytes_Check(PyTuple_GET_ITEM(item, 0))) {
        PyObject *text = PyTuple_GET_ITEM(item, 0), *openings = PyTuple_GET_ITEM(item, 1);
        p->text = PyBytes_AS_STRING(text);
        p->len = PyBytes_GET_SIZE(text);
        if (openings == Py_None) {
            p->kind = P_FIELDS;
            return 0;
        }
        p->kind = P_CELLS;
        if (PyUnicode_Check(openings)) {
            p->open = PyUnicode_AsUTF8AndSize(openings, &p->open_len);
            return p->open == NULL ? -1 : 0;
        }
        if (PyList_Check(openings) && PyList_GET_SIZE(openings) == m) {
            p->list = openings;
            return 0;
        }
        if (is_pick(openings))
            return setup_pick(&p->pick, PyTuple_GET_ITEM(openings, 0), PyTuple_GET_ITEM(openings, 1), m);
    }
    PyErr_SetString(PyExc_TypeError, "join_rows: a part is a list of m str, a str, an int, (texts, codes), "
                    "(bytes, openings) or (bytes, None)");
    return -1;
}

/* Bytes a part writes in all: exact, but for a block of cells (at most its text and, per
 * number, its longest opening and the cell's "><v></v></c>"). */
static int part_size(part_t *p, Py_ssize_t m, Py_ssize_t *size) {
    Py_ssize_t total = 0, n;
    switch (p->kind) {
    case P_LIST:
        for (Py_ssize_t r = 0; r < m; r++) {
            if (utf8_of(PyList_GET_ITEM(p->list, r), &n) == NULL)
                return -1;
            total += n;
        }
        break;
    case P_CONST:
        total = m * p->len;
        break;
    case P_PICK:
        for (Py_ssize_t r = 0; r < m; r++)
            total += p->pick.len[code_at(&p->pick, r)];
        break;
    case P_FIELDS:
        total = p->len;
        break;
    case P_COUNT:
        total = 20 * m;                              /* digits of a number below 2**63 */
        break;
    default: {                                       /* P_CELLS */
        Py_ssize_t longest = p->open_len, numbers = 1;
        if (p->list != NULL) {
            for (Py_ssize_t r = 0; r < m; r++) {
                if (utf8_of(PyList_GET_ITEM(p->list, r), &n) == NULL)
                    return -1;
                longest = n > longest ? n : longest;
            }
        }
        for (Py_ssize_t j = 0; j < p->pick.n; j++)
            longest = p->pick.len[j] > longest ? p->pick.len[j] : longest;
        for (Py_ssize_t i = 0; i < p->len; i++)
            numbers += p->text[i] == ',';
        total = p->len + numbers * (longest + 12);
    }
    }
    *size = total;
    return 0;
}

static PyObject *join_rows(PyObject *self, PyObject *args) {
    PyObject *parts_arg;
    Py_ssize_t m;
    const char *sep, *end;
    Py_ssize_t sep_len, end_len;
    if (!PyArg_ParseTuple(args, "Ons#s#:join_rows", &parts_arg, &m, &sep, &sep_len, &end, &end_len))
        return NULL;
    if (m < 0) {
        PyErr_SetString(PyExc_ValueError, "join_rows: m must be >= 0");
        return NULL;
    }
    PyObject *parts = PySequence_Fast(parts_arg, "join_rows: parts must be a sequence");
    if (parts == NULL)
        return NULL;
    Py_ssize_t np_ = PySequence_Fast_GET_SIZE(parts);
    part_t *ps = PyMem_Calloc((size_t)(np_ ? np_ : 1), sizeof(part_t));
    out_t o = {NULL, NULL, 0, 0};
    PyObject *result = NULL;
    if (ps == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t size = m * (end_len + (np_ ? np_ - 1 : 0) * sep_len);
    for (Py_ssize_t k = 0; k < np_; k++) {
        Py_ssize_t part;
        if (setup_part(&ps[k], PySequence_Fast_GET_ITEM(parts, k), m) < 0 || part_size(&ps[k], m, &part) < 0)
            goto done;
        size += part;
    }
    if (reserve(&o, size + 1) < 0)                   /* + 1: a bytes object of its own, never the empty one */
        goto done;
    for (Py_ssize_t r = 0; r < m; r++) {
        for (Py_ssize_t k = 0; k < np_; k++) {
            part_t *p = &ps[k];
            if (k && sep_len && put(&o, sep, sep_len) < 0)
                goto done;
            int rc;
            Py_ssize_t n;
            const char *s;
            switch (p->kind) {
            case P_LIST:
                s = utf8_of(PyList_GET_ITEM(p->list, r), &n);
                rc = s == NULL ? -1 : put(&o, s, n);
                break;
            case P_CONST:
                rc = put(&o, p->text, p->len);
                break;
            case P_COUNT:
                rc = put_count(&o, p->first + r);
                break;
            case P_PICK:
                n = code_at(&p->pick, r);
                rc = put(&o, p->pick.ptr[n], p->pick.len[n]);
                break;
            case P_CELLS:
                if (p->list != NULL) {
                    s = utf8_of(PyList_GET_ITEM(p->list, r), &n);
                    rc = s == NULL ? -1 : put_block_row(&o, p, s, n);
                } else if (p->pick.n) {
                    n = code_at(&p->pick, r);
                    rc = put_block_row(&o, p, p->pick.ptr[n], p->pick.len[n]);
                } else {
                    rc = put_block_row(&o, p, p->open, p->open_len);
                }
                break;
            default:
                rc = put_block_row(&o, p, NULL, 0);
            }
            if (rc < 0)
                goto done;
        }
        if (end_len && put(&o, end, end_len) < 0)
            goto done;
    }
    if (_PyBytes_Resize(&o.bytes, o.len) == 0) {
        result = o.bytes;
        o.bytes = NULL;
    }
done:
    Py_XDECREF(o.bytes);
    if (ps != NULL) {
        for (Py_ssize_t k = 0; k < np_; k++) {
            PyMem_Free(ps[k].pick.ptr);
            PyMem_Free(ps[k].pick.len);
        }
    }
    PyMem_Free(ps);
    Py_DECREF(parts);
    return result;
}

/* codes(values) -> (distinct, codes)
 *   values: hashable values (a list, or any iterable, read once). distinct: its values
 *   in order of first appearance (as dict.fromkeys keeps them); codes: per value the
 *   index of it in distinct, as bytes
 *   of 1, 2 or 4 bytes a code (the fewest that hold them; native order), what join_rows
 *   picks texts by. One pass, a dict lookup only where a value is not the object before
 *   it (a column's dtypes and verdicts come in runs of the same object).
 * cells.codes_py is the same function in Python. */
static PyObject *codes(PyObject *self, PyObject *values) {
    int is_list = PyList_Check(values);
    PyObject *it = is_list ? NULL : PyObject_GetIter(values);
    if (!is_list && it == NULL)
        return NULL;
    Py_ssize_t cap = is_list ? PyList_GET_SIZE(values) : 1024, n = 0;
    PyObject *index = PyDict_New(), *distinct = PyList_New(0), *out = NULL, *last = NULL;
    uint32_t *all = PyMem_Malloc((size_t)(cap ? cap : 1) * sizeof(uint32_t));
    if (index == NULL || distinct == NULL || all == NULL) {
        if (all == NULL)
            PyErr_NoMemory();
        goto done;
    }
    uint32_t last_code = 0;          /* of last, the value before (held: an __eq__ may drop it) */
    for (;; n++) {
        PyObject *v;
        if (is_list) {
            if (n >= PyList_GET_SIZE(values))        /* (read as it is now: an __eq__ may change it) */
                break;
            v = PyList_GET_ITEM(values, n);
            Py_INCREF(v);
        } else if ((v = PyIter_Next(it)) == NULL) {
            if (PyErr_Occurred())
                goto done;
            break;
        }
        if (n >= cap) {
            uint32_t *more = PyMem_Realloc(all, (size_t)(cap *= 2) * sizeof(uint32_t));
            if (more == NULL) {
                Py_DECREF(v);
                PyErr_NoMemory();
                goto done;
            }
            all = more;
        }
        if (v == last) {
            Py_DECREF(v);
        } else {
            Py_XSETREF(last, v);
            PyObject *code = PyDict_GetItemWithError(index, v);
            if (code == NULL) {
                if (PyErr_Occurred())
                    goto done;
                Py_ssize_t k = PyList_GET_SIZE(distinct);
                if (k >= (Py_ssize_t)UINT32_MAX) {
                    PyErr_SetString(PyExc_OverflowError, "codes: too many distinct values");
                    goto done;
                }
                code = PyLong_FromSsize_t(k);
                int failed = code == NULL || PyDict_SetItem(index, v, code) < 0 || PyList_Append(distinct, v) < 0;
                Py_XDECREF(code);
                if (failed)
                    goto done;
                last_code = (uint32_t)k;
            } else {
                last_code = (uint32_t)PyLong_AsSsize_t(code);
            }
        }
        all[n] = last_code;
    }
    Py_ssize_t k = PyList_GET_SIZE(distinct);
    int width = k <= 1 << 8 ? 1 : k <= 1 << 16 ? 2 : 4;
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, n * width);
    if (bytes == NULL)
        goto done;
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
    out = PyTuple_Pack(2, distinct, bytes);
    Py_DECREF(bytes);
done:
    Py_XDECREF(it);
    Py_XDECREF(last);
    PyMem_Free(all);
    Py_XDECREF(index);
    Py_XDECREF(distinct);
    return out;
}

static PyMethodDef methods[] = {
    {"join_rows", join_rows, METH_VARARGS,
     "join_rows(parts, m, sep, end) -> bytes: m rows, each its parts' texts in order"},
    {"codes", codes, METH_O,
     "codes(values) -> (distinct, codes): the distinct values in order, per value its index as bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cjoin", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cjoin(void) { return PyModule_Create(&module); }

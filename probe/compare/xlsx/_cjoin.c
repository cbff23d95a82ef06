/* The rows of the .xlsx writer's sheet XML, and of its CSV, joined in one pass.
 *
 * cells.encode_rows works a chunk of rows out a column at a time: per column one text
 * per row, or one text for every row, or, for a run of float columns, the text orjson
 * made of the whole block. A row of the file is those texts one after another. In
 * Python that took a zip, a chain, a join and an encode, and for each block of numbers
 * two str.replace and a split first (the block's commas becoming the XML between its
 * cells): about half of the 1.7 s that the main sheet of bench/compare.py's 100k-entry
 * pair took to encode. Here each byte is copied once.
 *
 * join_rows(parts, m, sep, end) -> bytes
 *   parts: a sequence of parts, each one of
 *     list of m str        row r writes parts[r]
 *     str                  every row writes it
 *     (bytes, openings)    a block of numbers, orjson's text of an m x k float64 array
 *                          ("[[a,b],[c,d]]"): row r writes each number x of its row as
 *                          opening + "><v>" + x + "</v></c>", or opening + "/>" where
 *                          x is null (a NaN); openings: a list of m str, or one str
 *     (bytes, None)        the same block as CSV fields: row r writes its numbers,
 *                          comma-separated, null as nothing
 *   sep: written between the parts of a row; end: after each row. Text is UTF-8.
 *
 * cells.join_rows_py is the same function in Python (used where this was not built);
 * tests/test_xlsx_join.py checks that both give the same bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum { P_LIST, P_CONST, P_CELLS, P_FIELDS };

typedef struct {
    int kind;
    PyObject *list;           /* P_LIST: the texts; P_CELLS: the openings, or NULL */
    const char *text;         /* P_CONST: the text; P_CELLS / P_FIELDS: the block */
    Py_ssize_t len;
    Py_ssize_t pos;           /* P_CELLS / P_FIELDS: where the next row starts */
    const char *open;         /* P_CELLS with one opening */
    Py_ssize_t open_len;
} part_t;

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} out_t;

static int reserve(out_t *o, Py_ssize_t need) {
    if (o->len + need <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : (Py_ssize_t)1 << 20;
    while (cap < o->len + need)
        cap *= 2;
    char *b = PyMem_Realloc(o->buf, (size_t)cap);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = b;
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

static int put_str(out_t *o, PyObject *s) {
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "join_rows: a row's text must be str, not %.100s",
                     Py_TYPE(s)->tp_name);
        return -1;
    }
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(s, &n);
    if (p == NULL)
        return -1;
    return put(o, p, n);
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
            if (put(o, open, open_len) < 0)
                return -1;
            if (null) {
                if (put(o, "/>", 2) < 0)
                    return -1;
            } else if (reserve(o, 12 + len) < 0) {
                return -1;
            } else {
                memcpy(o->buf + o->len, "><v>", 4);
                memcpy(o->buf + o->len + 4, t + start, (size_t)len);
                memcpy(o->buf + o->len + 4 + len, "</v></c>", 8);
                o->len += 12 + len;
            }
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

static int setup_part(part_t *p, PyObject *item, Py_ssize_t m) {
    memset(p, 0, sizeof(*p));
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
    if (PyUnicode_Check(item)) {
        p->kind = P_CONST;
        p->text = PyUnicode_AsUTF8AndSize(item, &p->len);
        return p->text == NULL ? -1 : 0;
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
    }
    PyErr_SetString(PyExc_TypeError, "join_rows: a part is a list of m str, a str, "
                    "(bytes, openings) or (bytes, None)");
    return -1;
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
    out_t o = {NULL, 0, 0};
    PyObject *result = NULL;
    if (ps == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < np_; k++)
        if (setup_part(&ps[k], PySequence_Fast_GET_ITEM(parts, k), m) < 0)
            goto done;
    for (Py_ssize_t r = 0; r < m; r++) {
        for (Py_ssize_t k = 0; k < np_; k++) {
            part_t *p = &ps[k];
            if (k && sep_len && put(&o, sep, sep_len) < 0)
                goto done;
            int rc;
            switch (p->kind) {
            case P_LIST:
                rc = put_str(&o, PyList_GET_ITEM(p->list, r));
                break;
            case P_CONST:
                rc = put(&o, p->text, p->len);
                break;
            case P_CELLS:
                if (p->list != NULL) {
                    PyObject *s = PyList_GET_ITEM(p->list, r);
                    Py_ssize_t n;
                    const char *op = PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &n) : NULL;
                    if (op == NULL) {
                        if (!PyErr_Occurred())
                            PyErr_SetString(PyExc_TypeError, "join_rows: an opening must be str");
                        goto done;
                    }
                    rc = put_block_row(&o, p, op, n);
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
    result = PyBytes_FromStringAndSize(o.buf ? o.buf : "", o.len);
done:
    PyMem_Free(o.buf);
    PyMem_Free(ps);
    Py_DECREF(parts);
    return result;
}

static PyMethodDef methods[] = {
    {"join_rows", join_rows, METH_VARARGS,
     "join_rows(parts, m, sep, end) -> bytes: m rows, each its parts' texts in order"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cjoin", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cjoin(void) { return PyModule_Create(&module); }

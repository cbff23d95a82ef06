/* The rows of a dump.json entry decoded as a reader.Entry struct, made in one pass.
 *
 * rows._entry_rows is the reference: for each part of the entry (input_args, input_kwargs,
 * input, parameters, output) each leaf becomes a rows.Row named "{entry}.{io}.{i or key}",
 * its statistics appended to the side's store (an array('d')). In Python that was a call of
 * rows._leaf per leaf: ~60% of the read of bench/compare.py's 100k-entry pair (700k rows).
 * Here the common leaves are made in C:
 *   - a tensor leaf (type torch.Tensor / numpy.ndarray, or dtype and shape both present)
 *     whose dtype is a str and whose statistics are floats, ints within float64 or null
 *     (NaN: as rows._num has it, taken only where all of them are floats or ints: the
 *     Python path's array.fromlist takes them all or none);
 *   - a value leaf (int, float, bool, str, null) of a plain type, or of another type name;
 * everything else (nested lists, None items, dict parts, a text among the statistics, an
 * integer beyond float64, an unknown value type) goes through the Python functions given
 * to init (rows._leaf, rows._walk), which give the same rows. The statistics made here are
 * appended to the store before such a call, so every row's place in it (Row.k) is the one
 * the Python path gives.
 *
 * init(Row, Leaf, Entry, UNSET, entry_keys, stat_keys, tensor_types, plain_types, dtypes, shapes,
 *      leaf, walk)       once, from rows.py
 * entry_rows(entry_name, entry, out, store)     rows._entry_rows's twin
 * fields(rows, names)       rows.fields_of's twin: several attributes of each row in one
 *                           pass (one visit of each row's memory, where a pass per field made
 *                           one each: 350k rows a side)
 * api_keys(entries, fw, bw) engine._api_keys's twin: an API call's entry with its counter
 *                           set to 0 (the Direction column parses each API once)
 * g3_texts(head, xs, tail)  engine._g3_texts's twin: the statistics judge's findings, one
 *                           text each ("statistics off by 2.5x the ...")
 * codes(values, identity)   codes.codes's twin for a list (each object hashed once, not
 *                           once per value: the table's and the diagnosis's columns)
 *
 * tests/test_compare_flatten.py checks that both give the same rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"
#include <stdint.h>
#include <string.h>

#define MAX_STATS 16
#define N_SMALL 64

/* fields of a Leaf, read through their member descriptors (no attribute lookup per leaf) */
enum { F_TYPE, F_DTYPE, F_SHAPE, F_REQUIRES_GRAD, F_MD5, F_DATA_NAME, F_VALUE,
       F_UNINITIALIZED, F_OPAQUE, N_FIELDS };
static const char *field_names[N_FIELDS] = {
    "type", "dtype", "shape", "requires_grad", "md5", "data_name", "value",
    "uninitialized", "opaque"};

static PyObject *Row, *Leaf, *EntryType, *Entry_unset, *tensor_types, *plain_types, *dtypes, *shapes;
static PyObject *py_leaf, *py_walk;
static PyObject *leaf_fields[N_FIELDS];
static PyObject *stat_fields[MAX_STATS];
static Py_ssize_t leaf_slots[N_FIELDS], stat_slots[MAX_STATS], part_slots[8];   /* slot_of each */
static Py_ssize_t n_stats;
static PyObject *part_keys[8], *part_ios[8], *part_descrs[8], *part_infixes[8];   /* infix: ".{io}." */
static Py_ssize_t n_parts;
static PyObject *s_tensor, *s_value, *s_empty_tuple, *small_ints[N_SMALL];
static PyObject *type_texts[5];      /* "<class 'int'>" ... for int, float, bool, str, NoneType */
static int ready;

/* where a struct keeps a field (its member descriptor's slot), -1 where it is not a plain slot */
static Py_ssize_t slot_of(PyObject *descr) {
    if (Py_TYPE(descr) != &PyMemberDescr_Type)
        return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    return m->type == T_OBJECT_EX || m->type == T_OBJECT ? m->offset : -1;
}

static PyObject *get_field(PyObject *descr, PyObject *obj);

/* a field of obj (of exactly the descriptor's type) read from its slot; the descriptor's
 * own way where the slot is empty or not known (the same value, or its error) */
static inline PyObject *field_at(PyObject *obj, PyObject *descr, Py_ssize_t offset) {
    if (offset >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + offset);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return get_field(descr, obj);
}

static PyObject *get_field(PyObject *descr, PyObject *obj) {
    descrgetfunc get = Py_TYPE(descr)->tp_descr_get;
    if (get == NULL) {
        Py_INCREF(descr);
        return descr;
    }
    return get(descr, obj, (PyObject *)Py_TYPE(obj));
}

static PyObject *c_init(PyObject *self, PyObject *args) {
    PyObject *entry_keys, *stat_keys;
    if (!PyArg_ParseTuple(args, "OOOOO!O!O!O!O!O!OO", &Row, &Leaf, &EntryType, &Entry_unset,
                          &PyTuple_Type, &entry_keys, &PyTuple_Type, &stat_keys,
                          &PyTuple_Type, &tensor_types, &PyTuple_Type, &plain_types,
                          &PyDict_Type, &dtypes, &PyDict_Type, &shapes, &py_leaf, &py_walk))
        return NULL;
    if (PyTuple_GET_SIZE(stat_keys) > MAX_STATS || PyTuple_GET_SIZE(entry_keys) > 8) {
        PyErr_SetString(PyExc_ValueError, "_cflat.init: too many statistics or entry keys");
        return NULL;
    }
    PyObject *objs[] = {Row, Leaf, EntryType, Entry_unset, tensor_types, plain_types, dtypes, shapes,
                        py_leaf, py_walk};
    for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++)
        Py_INCREF(objs[i]);
    for (int i = 0; i < N_FIELDS; i++)
        if ((leaf_fields[i] = PyObject_GetAttrString(Leaf, field_names[i])) == NULL)
            return NULL;
        else
            leaf_slots[i] = slot_of(leaf_fields[i]);
    n_stats = PyTuple_GET_SIZE(stat_keys);
    for (Py_ssize_t i = 0; i < n_stats; i++)
        if ((stat_fields[i] = PyObject_GetAttr(Leaf, PyTuple_GET_ITEM(stat_keys, i))) == NULL)
            return NULL;
        else
            stat_slots[i] = slot_of(stat_fields[i]);
    n_parts = PyTuple_GET_SIZE(entry_keys);
    for (Py_ssize_t i = 0; i < n_parts; i++) {
        PyObject *kv = PyTuple_GET_ITEM(entry_keys, i);
        if (!PyTuple_Check(kv) || PyTuple_GET_SIZE(kv) != 2) {
            PyErr_SetString(PyExc_TypeError, "_cflat.init: entry_keys must hold (key, io) pairs");
            return NULL;
        }
        part_keys[i] = PyTuple_GET_ITEM(kv, 0);
        part_ios[i] = PyTuple_GET_ITEM(kv, 1);
        Py_INCREF(part_keys[i]);
        Py_INCREF(part_ios[i]);
        if ((part_descrs[i] = PyObject_GetAttr(EntryType, part_keys[i])) == NULL
                || (part_infixes[i] = PyUnicode_FromFormat(".%U.", part_ios[i])) == NULL)
            return NULL;
        part_slots[i] = slot_of(part_descrs[i]);
    }
    s_tensor = PyUnicode_InternFromString("tensor");
    s_value = PyUnicode_InternFromString("value");
    s_empty_tuple = PyTuple_New(0);
    for (int i = 0; i < N_SMALL; i++)
        small_ints[i] = PyUnicode_FromFormat("%d", i);
    const char *names[5] = {"int", "float", "bool", "str", "NoneType"};
    for (int i = 0; i < 5; i++)
        type_texts[i] = PyUnicode_FromFormat("<class '%s'>", names[i]);
    ready = 1;
    Py_RETURN_NONE;
}

/* statistics of the rows made here and not yet in the store */
typedef struct {
    PyObject *store;
    double *buf;
    Py_ssize_t len, cap;     /* doubles */
    Py_ssize_t base;         /* rows in the store before buf */
} pending_t;

static int flush(pending_t *p) {
    if (p->len == 0)
        return 0;
    PyObject *view = PyMemoryView_FromMemory((char *)p->buf, p->len * (Py_ssize_t)sizeof(double),
                                             PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *r = PyObject_CallMethod(p->store, "frombytes", "O", view);
    Py_DECREF(view);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    p->base += p->len / n_stats;
    p->len = 0;
    return 0;
}

/* after a Python call that may have appended to the store: where its rows now end */
static int resync(pending_t *p) {
    Py_ssize_t n = PyObject_Length(p->store);
    if (n < 0)
        return -1;
    p->base = n / n_stats;
    return 0;
}

static int push(pending_t *p, const double *v) {
    if (p->len + n_stats > p->cap) {
        Py_ssize_t cap = p->cap ? p->cap * 2 : 64 * n_stats;
        double *b = PyMem_Realloc(p->buf, (size_t)cap * sizeof(double));
        if (b == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        p->buf = b;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, v, (size_t)n_stats * sizeof(double));
    p->len += n_stats;
    if (p->len >= (1 << 16) * n_stats)      /* into the store now and then: a small buffer */
        return flush(p);
    return 0;
}

/* a number as float64 into *out: 1 done, 0 not a case for this path, -1 error */
static int as_double(PyObject *x, double *out) {
    if (PyFloat_CheckExact(x)) {
        *out = PyFloat_AS_DOUBLE(x);
        return 1;
    }
    if (PyLong_CheckExact(x)) {
        double d = PyLong_AsDouble(x);
        if (d == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            return 0;                 /* beyond float64: rows._num's inf, in Python */
        }
        *out = d;
        return 1;
    }
    return 0;
}

static PyObject *call_python(PyObject *fn, PyObject *const *args, size_t n, pending_t *p) {
    if (flush(p) < 0)
        return NULL;
    PyObject *r = PyObject_Vectorcall(fn, args, n, NULL);
    if (r == NULL || resync(p) < 0) {
        Py_XDECREF(r);
        return NULL;
    }
    return r;
}

/* The last dtype text and shape tuple a leaf had, and the shared objects rows.py's dicts
 * gave for them: consecutive leaves mostly repeat them, and comparing with the last one
 * costs a fraction of hashing and looking up a new text or tuple (what the dicts would
 * give is the same object either way: equal keys, a dict that only grows). */
static PyObject *last_dtype_in, *last_dtype, *last_shape_in, *last_shape;

static int same_text(PyObject *a, PyObject *b) {          /* both exact str */
    if (a == b)
        return 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    return n == PyUnicode_GET_LENGTH(b) && PyUnicode_KIND(a) == PyUnicode_KIND(b)
           && memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * PyUnicode_KIND(a)) == 0;
}

static int same_shape(PyObject *a, PyObject *b) {         /* both exact tuples */
    if (a == b)
        return 1;
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (n != PyTuple_GET_SIZE(b))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(a, i), *y = PyTuple_GET_ITEM(b, i);
        if (x == y)
            continue;
        if (!PyLong_CheckExact(x) || !PyLong_CheckExact(y))
            return 0;
        int r = PyObject_RichCompareBool(x, y, Py_EQ);
        if (r != 1) {
            if (r < 0)
                PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* PySequence_Contains(texts, s) for a tuple and an exact str, by length and bytes */
static int text_in(PyObject *texts, PyObject *s) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(texts); i++) {
        PyObject *t = PyTuple_GET_ITEM(texts, i);
        if (!PyUnicode_CheckExact(t))
            return PySequence_Contains(texts, s);
        if (same_text(s, t))
            return 1;
    }
    return 0;
}

/* the shared object of key in dict (PyDict_SetDefault's, a new reference), the last one's
 * where key equals the last key */
static PyObject *shared(PyObject *dict, PyObject *key, PyObject **last_in, PyObject **last,
                        int (*same)(PyObject *, PyObject *)) {
    if (*last_in != NULL && same(key, *last_in)) {
        Py_INCREF(*last);
        return *last;
    }
    PyObject *out = PyDict_SetDefault(dict, key, key);
    if (out == NULL)
        return NULL;
    Py_INCREF(key);
    Py_XSETREF(*last_in, key);
    Py_INCREF(out);
    Py_XSETREF(*last, out);
    Py_INCREF(out);
    return out;
}

/* The row of one Leaf; NULL with no error set: not a case for this path. */
static PyObject *leaf_row(PyObject *name, PyObject *entry_name, PyObject *io, PyObject *leaf,
                          pending_t *p) {
    PyObject *f[N_FIELDS] = {NULL};
    PyObject *row = NULL, *dtype = NULL, *shape = NULL, *data_name;
    double stats[MAX_STATS];
    for (int i = 0; i < N_FIELDS; i++)
        if ((f[i] = field_at(leaf, leaf_fields[i], leaf_slots[i])) == NULL)
            goto done;
    PyObject *type = f[F_TYPE];
    if (!PyUnicode_CheckExact(type))
        goto done;
    int tensor = text_in(tensor_types, type);          /* (type: an exact str, checked above) */
    if (tensor < 0)
        goto done;
    if (!tensor)
        tensor = f[F_DTYPE] != Entry_unset && f[F_SHAPE] != Entry_unset;
    Py_ssize_t k = p->base + p->len / n_stats;
    PyObject *kk;
    if (tensor) {
        int ok = 1;
        for (Py_ssize_t s = 0; s < n_stats && ok; s++) {
            PyObject *x = field_at(leaf, stat_fields[s], stat_slots[s]);
            if (x == NULL)
                goto done;
            if (x == Py_None)
                stats[s] = Py_NAN;
            else {
                int r = as_double(x, &stats[s]);
                if (r < 0) {
                    Py_DECREF(x);
                    goto done;
                }
                ok = r;
            }
            Py_DECREF(x);
        }
        /* (the Python path's array.fromlist takes all or none, then rows._num: a None
         * among numbers is its NaN all the same, so only a text, a bool or a huge
         * integer goes there) */
        if (!ok || !PyUnicode_CheckExact(f[F_DTYPE]))
            goto done;
        PyObject *sh = f[F_SHAPE];
        if (sh == Entry_unset || sh == Py_None || (PyTuple_CheckExact(sh) && PyTuple_GET_SIZE(sh) == 0))
            sh = s_empty_tuple;
        else if (!PyTuple_CheckExact(sh))
            goto done;
        shape = shared(shapes, sh, &last_shape_in, &last_shape, same_shape);
        if (shape == NULL) {
            if (PyErr_ExceptionMatches(PyExc_TypeError))    /* a malformed shape: Python's */
                PyErr_Clear();
            goto done;
        }
        dtype = shared(dtypes, f[F_DTYPE], &last_dtype_in, &last_dtype, same_text);
        if (dtype == NULL)
            goto done;
        if (push(p, stats) < 0)
            goto done;
        int dn = PyObject_IsTrue(f[F_DATA_NAME]);
        if (dn < 0)
            goto done;
        data_name = dn ? f[F_DATA_NAME] : Py_None;
        PyObject *unread = (f[F_UNINITIALIZED] == Py_True || f[F_OPAQUE] == Py_True) ? Py_True : Py_False;
        if ((kk = PyLong_FromSsize_t(k)) == NULL)
            goto done;
        PyObject *args[13] = {name, entry_name, io, s_tensor, dtype, shape, p->store, kk,
                              f[F_REQUIRES_GRAD], f[F_MD5], data_name, Py_None, unread};
        row = PyObject_Vectorcall(Row, args, 13, NULL);
        Py_DECREF(kk);
        goto done;
    }
    /* a value: rows._leaf's dtype text and number */
    PyObject *value = f[F_VALUE];
    int plain = text_in(plain_types, type);
    if (plain < 0)
        goto done;
    double v;
    PyTypeObject *vt = Py_TYPE(value);
    int which = vt == &PyLong_Type ? 0 : vt == &PyFloat_Type ? 1 : vt == &PyBool_Type ? 2
              : vt == &PyUnicode_Type ? 3 : value == Py_None ? 4 : -1;
    if (plain) {
        if (which < 0)
            goto done;
        dtype = type_texts[which];
    } else
        dtype = type;
    Py_INCREF(dtype);
    if (which == 0) {
        int r = as_double(value, &v);
        if (r <= 0)
            goto done;
    } else if (which == 1)
        v = PyFloat_AS_DOUBLE(value);
    else if (which == 2)
        v = value == Py_True ? 1.0 : 0.0;
    else if (which == 3 || which == 4)
        v = Py_NAN;
    else
        goto done;                   /* another object: rows._num in Python */
    for (Py_ssize_t s = 0; s < n_stats; s++)
        stats[s] = v;
    if (push(p, stats) < 0)
        goto done;
    if ((kk = PyLong_FromSsize_t(k)) == NULL)
        goto done;
    PyObject *args[13] = {name, entry_name, io, s_value, dtype, s_empty_tuple, p->store, kk,
                          Py_None, Py_None, Py_None, value, Py_False};
    row = PyObject_Vectorcall(Row, args, 13, NULL);
    Py_DECREF(kk);
done:
    for (int i = 0; i < N_FIELDS; i++)
        Py_XDECREF(f[i]);
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    return row;
}

/* one item of a part: appended to out (in C or by rows._leaf / rows._walk) */
static int item_rows(PyObject *name, PyObject *entry_name, PyObject *io, PyObject *item,
                     PyObject *out, pending_t *p) {
    PyObject *row = NULL;
    if (Py_TYPE(item) == (PyTypeObject *)Leaf) {
        row = leaf_row(name, entry_name, io, item, p);
        if (row == NULL) {
            if (PyErr_Occurred())
                return -1;
            PyObject *args[5] = {name, entry_name, io, item, p->store};
            row = call_python(py_leaf, args, 5, p);
            if (row == NULL)
                return -1;
        }
        int r = PyList_Append(out, row);
        Py_DECREF(row);
        return r;
    }
    PyObject *args[6] = {name, entry_name, io, item, out, p->store};
    PyObject *r = call_python(py_walk, args, 6, p);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* the rows of one Entry appended to out, their statistics to p (not flushed) */
static int entry_rows(PyObject *entry_name, PyObject *entry, PyObject *out, pending_t *pp) {
#define p (*pp)
    for (Py_ssize_t j = 0; j < n_parts; j++) {
        PyObject *io = part_ios[j];
        PyObject *part = Py_TYPE(entry) == (PyTypeObject *)EntryType ? field_at(entry, part_descrs[j], part_slots[j])
                                                                     : PyObject_GetAttr(entry, part_keys[j]);
        if (part == NULL)
            goto fail;
        if (part == Entry_unset) {
            Py_DECREF(part);
            continue;
        }
        if (!PyList_CheckExact(part) && !PyDict_CheckExact(part)) {
            PyObject *name = PyUnicode_FromFormat("%U.%U", entry_name, io);
            int r = name == NULL ? -1 : item_rows(name, entry_name, io, part, out, pp);
            Py_XDECREF(name);
            Py_DECREF(part);
            if (r < 0)
                goto fail;
            continue;
        }
        PyObject *prefix = PyUnicode_Concat(entry_name, part_infixes[j]);
        if (prefix == NULL) {
            Py_DECREF(part);
            goto fail;
        }
        int r = 0;
        if (PyList_CheckExact(part)) {
            for (Py_ssize_t i = 0; r == 0 && i < PyList_GET_SIZE(part); i++) {
                PyObject *item = PyList_GET_ITEM(part, i);
                Py_INCREF(item);
                PyObject *num = i < N_SMALL ? (Py_INCREF(small_ints[i]), small_ints[i])
                                            : PyUnicode_FromFormat("%zd", i);
                PyObject *name = num == NULL ? NULL : PyUnicode_Concat(prefix, num);
                Py_XDECREF(num);
                r = name == NULL ? -1 : item_rows(name, entry_name, io, item, out, pp);
                Py_XDECREF(name);
                Py_DECREF(item);
            }
        } else {
            PyObject *key, *item;
            Py_ssize_t pos = 0;
            while (r == 0 && PyDict_Next(part, &pos, &key, &item)) {
                Py_INCREF(key);
                Py_INCREF(item);
                PyObject *text = PyObject_Str(key);
                PyObject *name = text == NULL ? NULL : PyUnicode_Concat(prefix, text);
                Py_XDECREF(text);
                r = name == NULL ? -1 : item_rows(name, entry_name, io, item, out, pp);
                Py_XDECREF(name);
                Py_DECREF(key);
                Py_DECREF(item);
            }
        }
        Py_DECREF(prefix);
        Py_DECREF(part);
        if (r < 0)
            goto fail;
    }
    return 0;
fail:
    return -1;
#undef p
}

static PyObject *c_entry_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "_cflat.init was not called");
        return NULL;
    }
    if (nargs != 4 || !PyUnicode_Check(args[0]) || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "entry_rows(entry_name: str, entry, out: list, store)");
        return NULL;
    }
    pending_t p = {args[3], NULL, 0, 0, 0};
    int r = resync(&p) < 0 || entry_rows(args[0], args[1], args[2], &p) < 0 || flush(&p) < 0;
    PyMem_Free(p.buf);
    if (r)
        return NULL;
    Py_RETURN_NONE;
}

/* side_rows(data, decode, decode_entry, skip, flatten, out, store) -> entries read
 *   data: entry name -> its raw JSON (msgspec.Raw), in file order (emptied here)
 *   decode(raw): the entry as a reader.Entry (raises where it does not fit one)
 *   decode_entry(name, raw): what reader.read_dump yields for it (an Entry, a dict, None;
 *     DumpError for a damaged entry): the way of an entry decode refused or that is named
 *     with skip (a parameters_grad entry: keyed by parameter name)
 *   flatten(name, entry, store): rows.flatten, for what is not an Entry without parameters
 *     (those, msprobe's order puts the parameters before the outputs: sorted in Python)
 * One call per dump instead of a generator chain and three calls per entry in Python. */
static PyObject *c_side_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "_cflat.init was not called");
        return NULL;
    }
    if (nargs != 7 || !PyDict_CheckExact(args[0]) || !PyUnicode_Check(args[3]) || !PyList_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "side_rows(data: dict, decode, decode_entry, skip: str, flatten, out: list, store)");
        return NULL;
    }
    PyObject *data = args[0], *decode = args[1], *decode_entry = args[2], *skip = args[3];
    PyObject *flatten = args[4], *out = args[5];
    pending_t p = {args[6], NULL, 0, 0, 0};
    Py_ssize_t pos = 0, count = 0;
    PyObject *name, *raw;
    static PyObject *s_parameters = NULL;
    if (s_parameters == NULL && (s_parameters = PyUnicode_InternFromString("parameters")) == NULL)
        return NULL;
    if (resync(&p) < 0)
        goto fail;
    while (PyDict_Next(data, &pos, &name, &raw)) {
        PyObject *entry = NULL;
        int r = -1;
        Py_INCREF(name);             /* (held across the Python calls below) */
        Py_INCREF(raw);
        int special = PyUnicode_Check(name) ? PyUnicode_Contains(name, skip) : 1;
        if (special < 0)
            goto next;
        if (!special) {
            entry = PyObject_CallOneArg(decode, raw);
            if (entry == NULL)
                PyErr_Clear();           /* decode_entry says why, or gives the dicts */
        }
        if (entry == NULL) {
            PyObject *a[2] = {name, raw};
            if ((entry = call_python(decode_entry, a, 2, &p)) == NULL)
                goto next;
        }
        int plain = 0;
        if (Py_TYPE(entry) == (PyTypeObject *)EntryType) {
            PyObject *params = PyObject_GetAttr(entry, s_parameters);
            if (params == NULL)
                goto next;
            plain = params == Entry_unset;
            Py_DECREF(params);
        }
        if (plain && PyUnicode_Check(name))     /* (a JSON key is text: the check is for other callers) */
            r = entry_rows(name, entry, out, &p);
        else {
            PyObject *a[3] = {name, entry, p.store};
            PyObject *rows = call_python(flatten, a, 3, &p);
            r = rows == NULL ? -1 : (PyList_SetSlice(out, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, rows));
            Py_XDECREF(rows);
        }
    next:
        Py_XDECREF(entry);
        Py_DECREF(name);
        Py_DECREF(raw);
        if (r < 0)
            goto fail;
        count++;
    }
    if (flush(&p) < 0)
        goto fail;
    PyMem_Free(p.buf);
    PyDict_Clear(data);
    return PyLong_FromSsize_t(count);
fail:
    PyMem_Free(p.buf);
    return NULL;
}

/* fields(rows, names) -> one list per name: each row's attribute, None for a None row */
static PyObject *c_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "fields(rows: list, names: tuple)");
        return NULL;
    }
    PyObject *rows = args[0], *names = args[1];
    Py_ssize_t n = PyList_GET_SIZE(rows), m = PyTuple_GET_SIZE(names);
    PyObject *out = PyTuple_New(m);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *col = PyList_New(n);
        if (col == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, j, col);
    }
    /* the rows' type's member descriptors, read directly (no attribute lookup per row) */
    PyTypeObject *known = NULL;
    PyObject *descrs[32] = {NULL};
    if (m > 32)
        m = -1;
    for (Py_ssize_t i = 0; i < n && m >= 0; i++) {
        if (PyList_GET_SIZE(rows) != n) {     /* an attribute read ran Python code (a property) that did it */
            for (Py_ssize_t jj = 0; jj < m; jj++)
                Py_XDECREF(descrs[jj]);
            Py_DECREF(out);
            PyErr_SetString(PyExc_RuntimeError, "fields: the rows changed size while read");
            return NULL;
        }
        PyObject *row = PyList_GET_ITEM(rows, i);
        Py_INCREF(row);              /* held while its attributes are read */
        if (row != Py_None && known == NULL) {
            known = Py_TYPE(row);
            for (Py_ssize_t j = 0; j < m; j++) {
                PyObject *d = PyObject_GetAttr((PyObject *)known, PyTuple_GET_ITEM(names, j));
                if (d == NULL)
                    PyErr_Clear();
                else if (Py_TYPE(d) != &PyMemberDescr_Type)
                    Py_CLEAR(d);
                descrs[j] = d;
            }
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            PyObject *v;
            if (row == Py_None) {
                v = Py_None;
                Py_INCREF(v);
            } else if (Py_TYPE(row) == known && descrs[j] != NULL)
                v = Py_TYPE(descrs[j])->tp_descr_get(descrs[j], row, (PyObject *)known);
            else
                v = PyObject_GetAttr(row, PyTuple_GET_ITEM(names, j));
            if (v == NULL) {
                for (Py_ssize_t jj = 0; jj < m; jj++)
                    Py_XDECREF(descrs[jj]);
                Py_DECREF(row);
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(PyTuple_GET_ITEM(out, j), i, v);
        }
        Py_DECREF(row);
    }
    for (Py_ssize_t j = 0; j < m; j++)
        Py_XDECREF(descrs[j]);
    if (m < 0) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "fields: at most 32 names");
        return NULL;
    }
    return out;
}

/* codes(values, identity) -> (distinct, codes): codes.codes's twin for a list: the distinct
 * values in order of first appearance and, per value, its index among them as int32 (a
 * bytearray). Equal values share a code as dict.fromkeys has them (identity, then hash and
 * ==); with identity true, only the same object does (a side's rows share one shape tuple,
 * one dtype text per distinct value). Each object is looked up in a table of pointers first:
 * the dict (hash, ==) is consulted once per distinct object, not once per value. */
typedef struct {
    PyObject **keys;
    int32_t *vals;
    size_t mask;
    size_t used;
} ptrmap_t;

static size_t ptr_slot(const ptrmap_t *m, PyObject *o) {
    size_t h = (size_t)o;
    h ^= h >> 17;
    h *= (size_t)0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    size_t i = h & m->mask;
    while (m->keys[i] != NULL && m->keys[i] != o)
        i = (i + 1) & m->mask;
    return i;
}

static int ptr_grow(ptrmap_t *m) {
    size_t cap = (m->mask + 1) * 2;
    PyObject **keys = PyMem_Calloc(cap, sizeof(PyObject *));
    int32_t *vals = PyMem_Malloc(cap * sizeof(int32_t));
    if (keys == NULL || vals == NULL) {
        PyMem_Free(keys);
        PyMem_Free(vals);
        PyErr_NoMemory();
        return -1;
    }
    ptrmap_t bigger = {keys, vals, cap - 1, m->used};
    for (size_t i = 0; i <= m->mask; i++)
        if (m->keys[i] != NULL) {
            size_t j = ptr_slot(&bigger, m->keys[i]);
            keys[j] = m->keys[i];
            vals[j] = m->vals[i];
        }
    PyMem_Free(m->keys);
    PyMem_Free(m->vals);
    *m = bigger;
    return 0;
}

static PyObject *c_codes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "codes(values: list, identity: bool)");
        return NULL;
    }
    PyObject *values = args[0];
    int identity = PyObject_IsTrue(args[1]);
    if (identity < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *distinct = PyList_New(0), *index = identity ? NULL : PyDict_New(), *seen = PyList_New(0);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    ptrmap_t m = {PyMem_Calloc(64, sizeof(PyObject *)), PyMem_Malloc(64 * sizeof(int32_t)), 63, 0};
    PyObject *result = NULL;
    if (distinct == NULL || (!identity && index == NULL) || seen == NULL || out == NULL
            || m.keys == NULL || m.vals == NULL) {
        if (m.keys == NULL || m.vals == NULL)
            PyErr_NoMemory();
        goto done;
    }
    int32_t *code = (int32_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_GET_SIZE(values) != n) {     /* an __eq__ or __hash__ changed the list */
            PyErr_SetString(PyExc_RuntimeError, "codes: the values changed size while read");
            goto done;
        }
        PyObject *v = PyList_GET_ITEM(values, i);
        size_t slot = ptr_slot(&m, v);
        if (m.keys[slot] != NULL) {
            code[i] = m.vals[slot];
            continue;
        }
        Py_INCREF(v);
        int32_t c;
        if (identity) {
            c = (int32_t)PyList_GET_SIZE(distinct);
            if (PyList_Append(distinct, v) < 0) {
                Py_DECREF(v);
                goto done;
            }
        } else {
            PyObject *next = PyLong_FromSsize_t(PyList_GET_SIZE(distinct));
            PyObject *got = next == NULL ? NULL : PyDict_SetDefault(index, v, next);
            if (got == NULL) {
                Py_XDECREF(next);
                Py_DECREF(v);
                goto done;
            }
            if (got == next && PyList_Append(distinct, v) < 0) {
                Py_DECREF(next);
                Py_DECREF(v);
                goto done;
            }
            c = (int32_t)PyLong_AsLong(got);
            Py_DECREF(next);
        }
        /* the object is held (in seen) while its address is a key of the table */
        if (PyList_Append(seen, v) < 0) {
            Py_DECREF(v);
            goto done;
        }
        Py_DECREF(v);
        if ((m.used + 1) * 2 > m.mask + 1 && ptr_grow(&m) < 0)
            goto done;
        slot = ptr_slot(&m, v);
        m.keys[slot] = v;
        m.vals[slot] = c;
        m.used++;
        code[i] = c;
    }
    result = PyTuple_Pack(2, distinct, out);
done:
    PyMem_Free(m.keys);
    PyMem_Free(m.vals);
    Py_XDECREF(distinct);
    Py_XDECREF(index);
    Py_XDECREF(seen);
    Py_XDECREF(out);
    return result;
}

/* api_keys(entries) -> per entry its key for engine._directions: "{base}.0.{forward|backward}"
 * for an API call's entry "{base}.{digits}.{forward|backward}" (base not empty, the digits
 * ASCII), else the entry itself (the same object; anything that is not text too). One
 * object per distinct key (a few hundred APIs for 100k entries: not 100k texts at once). */
static PyObject *c_api_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyUnicode_CheckExact(args[1]) || !PyUnicode_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "api_keys(entries: list, forward: str, backward: str)");
        return NULL;
    }
    PyObject *entries = args[0], *s_forward = args[1], *s_backward = args[2];
    Py_ssize_t n = PyList_GET_SIZE(entries);
    PyObject *out = PyList_New(n), *seen = PyDict_New();   /* seen: one object per distinct key */
    if (out == NULL || seen == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(seen);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(entries, i), *key = NULL;
        if (PyUnicode_CheckExact(e)) {
            Py_ssize_t len = PyUnicode_GET_LENGTH(e);
            Py_ssize_t dot = PyUnicode_FindChar(e, '.', 0, len, -1);
            if (dot == -2)
                goto fail;
            PyObject *last = NULL;
            if (dot >= 0) {
                Py_ssize_t tail = len - dot - 1;
                PyObject *which = tail == PyUnicode_GET_LENGTH(s_forward) ? s_forward
                                : tail == PyUnicode_GET_LENGTH(s_backward) ? s_backward : NULL;
                if (which != NULL) {
                    int m = PyUnicode_Tailmatch(e, which, dot + 1, len, 1);
                    if (m < 0)
                        goto fail;
                    if (m)
                        last = which;
                }
            }
            if (last != NULL) {
                Py_ssize_t dot2 = dot > 0 ? PyUnicode_FindChar(e, '.', 0, dot, -1) : -1;
                if (dot2 == -2)
                    goto fail;
                int kind = PyUnicode_KIND(e);
                const void *data = PyUnicode_DATA(e);
                int digits = dot2 > 0 && dot - dot2 > 1;      /* a base and at least one digit */
                for (Py_ssize_t j = dot2 + 1; digits && j < dot; j++) {
                    Py_UCS4 ch = PyUnicode_READ(kind, data, j);
                    digits = ch >= '0' && ch <= '9';
                }
                if (digits) {
                    PyObject *base = PyUnicode_Substring(e, 0, dot2);
                    key = base == NULL ? NULL : PyUnicode_FromFormat("%U.0.%U", base, last);
                    Py_XDECREF(base);
                    if (key == NULL)
                        goto fail;
                    PyObject *first = PyDict_SetDefault(seen, key, key);
                    Py_XINCREF(first);
                    Py_DECREF(key);
                    if ((key = first) == NULL)
                        goto fail;
                }
            }
        }
        if (key == NULL) {
            key = e;
            Py_INCREF(key);
        }
        PyList_SET_ITEM(out, i, key);
    }
    Py_DECREF(seen);
    return out;
fail:
    Py_DECREF(out);
    Py_DECREF(seen);
    return NULL;
}

/* g3_texts(head, numbers, tail) -> [head + ("%.3g" % x) + tail for x in numbers]: the
 * statistics judge's findings (hundreds of thousands), each made as one text; numbers: a
 * buffer of float64 (a numpy array). printf's %.3g is PyOS_double_to_string(x, 'g', 3, 0). */
static PyObject *c_g3_texts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_CheckExact(args[0]) || !PyUnicode_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "g3_texts(head: str, numbers: float64 buffer, tail: str)");
        return NULL;
    }
    PyObject *head = args[0], *tail = args[2];
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (view.itemsize != sizeof(double) || view.format == NULL || strcmp(view.format, "d") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "g3_texts: numbers must be float64");
        return NULL;
    }
    Py_ssize_t n = view.len / (Py_ssize_t)sizeof(double);
    const double *x = (const double *)view.buf;
    Py_ssize_t lh = PyUnicode_GET_LENGTH(head), lt = PyUnicode_GET_LENGTH(tail);
    Py_UCS4 maxchar = PyUnicode_MAX_CHAR_VALUE(head);
    if (PyUnicode_MAX_CHAR_VALUE(tail) > maxchar)
        maxchar = PyUnicode_MAX_CHAR_VALUE(tail);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        char *num = PyOS_double_to_string(x[i], 'g', 3, 0, NULL);
        if (num == NULL)
            goto fail;
        Py_ssize_t ln = (Py_ssize_t)strlen(num);
        PyObject *text = PyUnicode_New(lh + ln + lt, maxchar);
        if (text == NULL) {
            PyMem_Free(num);
            goto fail;
        }
        PyUnicode_CopyCharacters(text, 0, head, 0, lh);
        for (Py_ssize_t j = 0; j < ln; j++)
            PyUnicode_WRITE(PyUnicode_KIND(text), PyUnicode_DATA(text), lh + j, (Py_UCS4)(unsigned char)num[j]);
        PyUnicode_CopyCharacters(text, lh + ln, tail, 0, lt);
        PyMem_Free(num);
        PyList_SET_ITEM(out, i, text);
    }
    PyBuffer_Release(&view);
    return out;
fail:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"g3_texts", (PyCFunction)(void (*)(void))c_g3_texts, METH_FASTCALL,
     "g3_texts(head, numbers, tail): head + '%.3g' % x + tail for each float64 x."},
    {"api_keys", (PyCFunction)(void (*)(void))c_api_keys, METH_FASTCALL,
     "api_keys(entries, forward, backward): per entry, its API call's key with the counter set to 0."},
    {"codes", (PyCFunction)(void (*)(void))c_codes, METH_FASTCALL,
     "codes(values, identity): the distinct values in order and each value's index among them (int32)."},
    {"fields", (PyCFunction)(void (*)(void))c_fields, METH_FASTCALL,
     "fields(rows, names): per name, each row's attribute (None for a None row), in one pass."},
    {"init", c_init, METH_VARARGS, "init(Row, Leaf, Entry, UNSET, entry_keys, stat_keys, tensor_types, "
     "plain_types, dtypes, shapes, leaf, walk): what entry_rows makes and falls back on."},
    {"side_rows", (PyCFunction)(void (*)(void))c_side_rows, METH_FASTCALL,
     "side_rows(data, decode, decode_entry, skip, flatten, out, store): every entry's rows, in one call."},
    {"entry_rows", (PyCFunction)(void (*)(void))c_entry_rows, METH_FASTCALL,
     "entry_rows(entry_name, entry, out, store): rows._entry_rows in one pass."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cflat",
                                    "The rows of a dump.json entry in one pass.", -1, methods};

PyMODINIT_FUNC PyInit__cflat(void) { return PyModule_Create(&module); }

/* The texts of floats in the compare's workbook and CSV, made without the GIL.
 *
 * A float's text is its shortest digits that read back as the same float (std::to_chars,
 * which libstdc++ and MSVC make with Ryu), laid out as Ryu's printer lays them out:
 * "1.0", "0.00001", "1e-7", "1.2e30" -- what orjson wrote before 3.11.7 (3.11.7 writes
 * "1.2e+30"), so the files no longer depend on orjson's version. probe.compare.xlsx.numbers
 * is the same layout in Python (from repr's digits, which are the same digits), used where
 * this was not built; tests/test_xlsx_numbers.py checks that both give the same texts.
 *
 * Why here and not orjson: the 100k-entry compare writes 7M numbers, ~0.6 s of orjson
 * holding the GIL on the main thread (bench/compare.py). A Block's text is made by the
 * writer threads that join its rows (_cjoin: the sheet's and the CSV's, each taking a share;
 * one making it all while the other waited held up the sheet's writer, 0.5 s of waits)
 * while the main thread encodes the next chunk.
 *
 * text(x) -> str           one float's text ("null" for NaN and infinities)
 * texts(values) -> list    each value's text: a list of floats, ints and None ("null"),
 *                          or a 1-d float64 array; TypeError for any other value
 * Block(array)             a float64 m x k array (C order) whose rows' texts are made on
 *                          first use, shared among the threads that ask for them together
 *                          (_cfloat.h); .text() -> bytes, "[[a,b],[c,d]]"
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>

#include "_cfloat.h"

namespace {

constexpr Py_ssize_t MAX_TEXT = 24;      /* "-1.2345678901234567e-308" */

/* The text of a finite float into out (MAX_TEXT bytes at least): its length. */
Py_ssize_t finite_text(double v, char *out) {
    char sci[32];
    char *end = std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific).ptr;
    const char *p = sci;
    char *o = out;
    if (*p == '-') {
        *o++ = '-';
        p++;
    }
    char digits[20];
    int n = 0;
    while (*p != 'e') {                  /* "d.ddd": the digits without the point */
        if (*p != '.')
            digits[n++] = *p;
        p++;
    }
    bool negative = p[1] == '-';
    int e = 0;
    for (p += 2; p < end; p++)
        e = e * 10 + (*p - '0');
    if (negative)
        e = -e;
    if (n == 1 && digits[0] == '0') {    /* 0.0 and -0.0 */
        std::memcpy(o, "0.0", 3);
        return (o - out) + 3;
    }
    int kk = e + 1, k = kk - n;          /* 10^(kk-1) <= |v| < 10^kk; v = digits * 10^k */
    if (k >= 0 && kk <= 16) {            /* 1234e7 -> 12340000000.0 */
        std::memcpy(o, digits, n);
        o += n;
        for (int i = n; i < kk; i++)
            *o++ = '0';
        *o++ = '.';
        *o++ = '0';
    } else if (kk > 0 && kk <= 16) {     /* 1234e-2 -> 12.34 */
        std::memcpy(o, digits, kk);
        o += kk;
        *o++ = '.';
        std::memcpy(o, digits + kk, n - kk);
        o += n - kk;
    } else if (kk > -5 && kk <= 0) {     /* 1234e-6 -> 0.001234 */
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -kk; i++)
            *o++ = '0';
        std::memcpy(o, digits, n);
        o += n;
    } else {                             /* 1e30, 1234e30 -> 1.234e33 */
        *o++ = digits[0];
        if (n > 1) {
            *o++ = '.';
            std::memcpy(o, digits + 1, n - 1);
            o += n - 1;
        }
        *o++ = 'e';
        int x = kk - 1;
        if (x < 0) {
            *o++ = '-';
            x = -x;
        }
        if (x >= 100)
            *o++ = (char)('0' + x / 100);
        if (x >= 10)
            *o++ = (char)('0' + x / 10 % 10);
        *o++ = (char)('0' + x % 10);
    }
    return o - out;
}

Py_ssize_t number_text(double v, char *out) {
    if (!std::isfinite(v)) {
        std::memcpy(out, "null", 4);
        return 4;
    }
    return finite_text(v, out);
}

PyObject *ascii_str(const char *s, Py_ssize_t n) {
    PyObject *u = PyUnicode_New(n, 127);
    if (u != nullptr)
        std::memcpy(PyUnicode_DATA(u), s, (size_t)n);
    return u;
}

PyObject *text(PyObject *, PyObject *arg) {
    double v = PyFloat_AsDouble(arg);
    if (v == -1.0 && PyErr_Occurred())
        return nullptr;
    char buf[MAX_TEXT];
    return ascii_str(buf, number_text(v, buf));
}

bool is_float64(const Py_buffer &view) {
    const char *f = view.format;
    if (f != nullptr && (*f == '<' || *f == '=' || *f == '@'))
        f++;
    return view.itemsize == 8 && f != nullptr && std::strcmp(f, "d") == 0;
}

PyObject *array_texts(PyObject *values) {
    Py_buffer view;
    if (PyObject_GetBuffer(values, &view, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return nullptr;
    if (view.ndim != 1 || !is_float64(view)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "texts: an array must be 1-d float64");
        return nullptr;
    }
    Py_ssize_t n = view.shape[0], stride = view.strides[0];
    PyObject *out = PyList_New(n);
    char buf[MAX_TEXT];
    for (Py_ssize_t i = 0; out != nullptr && i < n; i++) {
        double v;
        std::memcpy(&v, (const char *)view.buf + i * stride, 8);
        PyObject *s = ascii_str(buf, number_text(v, buf));
        if (s == nullptr)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, s);
    }
    PyBuffer_Release(&view);
    return out;
}

PyObject *texts(PyObject *, PyObject *values) {
    if (!PyList_Check(values))
        return array_texts(values);
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *out = PyList_New(n);
    if (out == nullptr)
        return nullptr;
    PyObject *null = nullptr;
    char buf[MAX_TEXT];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i), *s;
        if (PyFloat_CheckExact(v)) {
            s = ascii_str(buf, number_text(PyFloat_AS_DOUBLE(v), buf));
        } else if (v == Py_None) {
            if (null == nullptr && (null = ascii_str("null", 4)) == nullptr)
                goto fail;
            Py_INCREF(null);
            s = null;
        } else if (PyLong_CheckExact(v)) {
            s = PyObject_Str(v);
        } else {
            PyErr_Format(PyExc_TypeError, "texts: a value is a float, an int or None, not %.100s",
                         Py_TYPE(v)->tp_name);
            goto fail;
        }
        if (s == nullptr)
            goto fail;
        PyList_SET_ITEM(out, i, s);
    }
    Py_XDECREF(null);
    return out;
fail:
    Py_XDECREF(null);
    Py_DECREF(out);
    return nullptr;
}

/* Block: see the top of the file and _cfloat.h. Row r's text is written at r * row_cap
 * (a row's numbers take at most that), its length in lens[r]. */
constexpr Py_ssize_t SHARE_ROWS = 256;   /* rows a thread takes at a time: 16 shares a chunk */

struct Shares {                 /* how the threads that make a block's text share it */
    std::atomic<Py_ssize_t> next{0}, done{0};
    std::mutex lock;
    std::condition_variable all_done;
};

struct Block {
    PyObject_HEAD
    Py_buffer view;
    Py_ssize_t m, k, row_cap;
    char *text;                 /* m * row_cap bytes, allocated by the thread that made the block */
    Py_ssize_t *lens;
    Shares *shares;
};

PyTypeObject *block_type;

Py_ssize_t row_text(const Block *b, Py_ssize_t r) {
    const char *v = (const char *)b->view.buf + r * b->k * 8;
    char *start = b->text + r * b->row_cap, *o = start;
    for (Py_ssize_t j = 0; j < b->k; j++) {
        double x;
        std::memcpy(&x, v + 8 * j, 8);           /* (a buffer need not be aligned) */
        if (j)
            *o++ = ',';
        o += number_text(x, o);
    }
    return o - start;
}

void block_make(PyObject *obj) {
    Block *b = (Block *)obj;
    Shares *s = b->shares;
    Py_ssize_t total = (b->m + SHARE_ROWS - 1) / SHARE_ROWS;
    if (s->done.load(std::memory_order_acquire) == total)
        return;
    for (Py_ssize_t c; (c = s->next.fetch_add(1)) < total;) {
        Py_ssize_t hi = std::min(b->m, (c + 1) * SHARE_ROWS);
        for (Py_ssize_t r = c * SHARE_ROWS; r < hi; r++)
            b->lens[r] = row_text(b, r);
        if (s->done.fetch_add(1, std::memory_order_acq_rel) + 1 == total) {
            std::lock_guard<std::mutex> guard(s->lock);
            s->all_done.notify_all();
        }
    }
    std::unique_lock<std::mutex> guard(s->lock);
    s->all_done.wait(guard, [&] { return s->done.load(std::memory_order_acquire) == total; });
}

const char *block_row(PyObject *obj, Py_ssize_t r, Py_ssize_t *len) {
    Block *b = (Block *)obj;
    *len = b->lens[r];
    return b->text + r * b->row_cap;
}

PyObject *Block_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *array;
    static const char *names[] = {"array", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Block", (char **)names, &array))
        return nullptr;
    Block *b = (Block *)type->tp_alloc(type, 0);
    if (b == nullptr)
        return nullptr;
    b->text = nullptr;
    b->lens = nullptr;
    b->shares = nullptr;
    if (PyObject_GetBuffer(array, &b->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        b->view.obj = nullptr;
        Py_DECREF(b);
        return nullptr;
    }
    if (b->view.ndim != 2 || !is_float64(b->view)) {
        PyErr_SetString(PyExc_TypeError, "Block: the array must be 2-d float64");
        Py_DECREF(b);
        return nullptr;
    }
    b->m = b->view.shape[0];
    b->k = b->view.shape[1];
    b->row_cap = b->k * (MAX_TEXT + 1);
    b->shares = new (std::nothrow) Shares();
    /* made here, by the encoding thread: see _cjoin's rows() on writer threads' heaps */
    b->text = (char *)PyMem_RawMalloc((size_t)(b->m * b->row_cap + 1));
    b->lens = (Py_ssize_t *)PyMem_RawMalloc((size_t)(b->m + 1) * sizeof(Py_ssize_t));
    if (b->shares == nullptr || b->text == nullptr || b->lens == nullptr) {
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    return (PyObject *)b;
}

void Block_dealloc(PyObject *obj) {
    Block *b = (Block *)obj;
    if (b->view.obj != nullptr)
        PyBuffer_Release(&b->view);
    PyMem_RawFree(b->text);
    PyMem_RawFree(b->lens);
    delete b->shares;
    PyTypeObject *type = Py_TYPE(obj);
    type->tp_free(obj);
    Py_DECREF(type);
}

PyObject *Block_text(PyObject *obj, PyObject *) {
    Block *b = (Block *)obj;
    Py_BEGIN_ALLOW_THREADS
    block_make(obj);
    Py_END_ALLOW_THREADS
    if (b->m == 0)
        return PyBytes_FromStringAndSize("[]", 2);
    Py_ssize_t size = 2 + 3 * b->m;                    /* "[" "]", and "[" "]" "," a row */
    for (Py_ssize_t r = 0; r < b->m; r++)
        size += b->lens[r];
    PyObject *out = PyBytes_FromStringAndSize(nullptr, size - 1);
    if (out == nullptr)
        return nullptr;
    char *o = PyBytes_AS_STRING(out);
    *o++ = '[';
    for (Py_ssize_t r = 0; r < b->m; r++) {
        if (r)
            *o++ = ',';
        *o++ = '[';
        std::memcpy(o, b->text + r * b->row_cap, (size_t)b->lens[r]);
        o += b->lens[r];
        *o++ = ']';
    }
    *o = ']';
    return out;
}

PyMethodDef Block_methods[] = {
    {"text", Block_text, METH_NOARGS, "text() -> bytes: the block's numbers as \"[[a,b],[c,d]]\""},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot Block_slots[] = {
    {Py_tp_new, (void *)Block_new},
    {Py_tp_dealloc, (void *)Block_dealloc},
    {Py_tp_methods, Block_methods},
    {Py_tp_doc, (void *)"Block(array): a float64 m x k array whose text is made on first use, "
                        "on any thread"},
    {0, nullptr},
};

PyType_Spec Block_spec = {"probe.compare.xlsx._cfloat.Block", sizeof(Block), 0, Py_TPFLAGS_DEFAULT,
                          Block_slots};

int is_block(PyObject *obj) { return Py_TYPE(obj) == block_type; }
Py_ssize_t rows_of(PyObject *obj) { return ((Block *)obj)->m; }
Py_ssize_t count_of(PyObject *obj) { return ((Block *)obj)->m * ((Block *)obj)->k; }
Py_ssize_t bound_of(PyObject *obj) { return ((Block *)obj)->m * ((Block *)obj)->row_cap; }

probe_cfloat_api api = {is_block, rows_of, count_of, bound_of, block_make, block_row};

PyMethodDef methods[] = {
    {"text", text, METH_O, "text(x) -> str: one float's text (\"null\" for NaN and infinities)"},
    {"texts", texts, METH_O, "texts(values) -> list of str: a list of floats, ints and None, or a 1-d "
                             "float64 array"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cfloat", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__cfloat(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == nullptr)
        return nullptr;
    block_type = (PyTypeObject *)PyType_FromSpec(&Block_spec);
    PyObject *capsule = PyCapsule_New(&api, PROBE_CFLOAT_CAPSULE, nullptr);
    if (block_type == nullptr || capsule == nullptr
        || PyModule_AddObject(m, "Block", (PyObject *)block_type) < 0) {
        Py_XDECREF(block_type);
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return nullptr;
    }
    Py_INCREF(block_type);
    if (PyModule_AddObject(m, "api", capsule) < 0) {
        Py_DECREF(capsule);
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}

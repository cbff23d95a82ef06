/* The key of a call stack for probe's StackTable, read without running Python per frame.
 *
 * A dumped API's stack is recorded on every call, but a training loop repeats the same
 * few stacks: the table formats a stack once and then only needs to recognise it. Walking
 * 20-40 frames in Python (f_code, f_lasti, f_back and an id() per frame) costs several
 * microseconds per call; here it is a loop over pointers.
 *
 * frame_key(frame) -> bytes
 *   The (code object address, last instruction offset) of ``frame`` and every frame
 *   below it, packed. Two calls give equal bytes when they were made from the same
 *   instructions of the same code objects. The caller keeps the code objects alive
 *   while it holds the key, so an address cannot be reused by another code object.
 *   None for a stack deeper than MAX_FRAMES (the caller takes its slow path).
 *
 * Built as an optional extension: without a C compiler stack.py builds the same kind of
 * key in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>
#include <string.h>

#define MAX_FRAMES 1024   /* deeper than Python's default recursion limit */

typedef struct {
    const void *code;
    int64_t lasti;
} site;

static int64_t frame_lasti(PyFrameObject *f) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(f);
#else
    return f->f_lasti;
#endif
}

static PyObject *frame_key(PyObject *self, PyObject *frame) {
    if (!PyFrame_Check(frame)) {
        PyErr_SetString(PyExc_TypeError, "frame_key(frame): need a frame object");
        return NULL;
    }
    site sites[MAX_FRAMES];
    Py_ssize_t n = 0;
    PyFrameObject *f = (PyFrameObject *)frame;
    Py_INCREF(f);
    while (f != NULL && n < MAX_FRAMES) {
        PyCodeObject *code = PyFrame_GetCode(f);   /* new reference */
        sites[n].code = code;
        sites[n].lasti = frame_lasti(f);
        Py_DECREF(code);                           /* the frame keeps it alive */
        n++;
        PyFrameObject *back = PyFrame_GetBack(f);  /* new reference or NULL */
        Py_DECREF(f);
        f = back;
    }
    if (f != NULL) {
        Py_DECREF(f);
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)sites, n * (Py_ssize_t)sizeof(site));
}

static PyMethodDef methods[] = {
    {"frame_key", frame_key, METH_O,
     "frame_key(frame) -> bytes naming the (code, instruction) of frame and every frame below it"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cstack", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cstack(void) {
    return PyModule_Create(&module);
}

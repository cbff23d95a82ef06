/* What probe.compare.xlsx._cfloat gives other C extensions (_cjoin) through the capsule
 * "probe.compare.xlsx._cfloat.api": a Block (a float64 m x k array whose rows' text is made
 * on first use, by the threads that ask for it together) read without the GIL. */
#ifndef PROBE_CFLOAT_H
#define PROBE_CFLOAT_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    /* Whether obj is a Block (with the GIL). */
    int (*is_block)(PyObject *obj);
    /* How many rows it holds, how many numbers (rows x columns), and the bytes its rows'
     * texts take at most. */
    Py_ssize_t (*rows)(PyObject *block);
    Py_ssize_t (*count)(PyObject *block);
    Py_ssize_t (*bound)(PyObject *block);
    /* Its rows' texts made: without the GIL, from any thread. Threads that call it together
     * share the work (a few hundred rows at a time) and each returns once all is made. */
    void (*make)(PyObject *block);
    /* Row r's text after make: "a,b,c" as orjson wrote a float64 array's row before 3.11.7
     * ("null" for NaN and infinities); it lives as long as the block. */
    const char *(*row)(PyObject *block, Py_ssize_t r, Py_ssize_t *len);
} probe_cfloat_api;

#define PROBE_CFLOAT_CAPSULE "probe.compare.xlsx._cfloat.api"

#ifdef __cplusplus
}
#endif

#endif

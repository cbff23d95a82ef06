/* What probe.compare.xlsx._cfloat gives other C extensions (_cjoin) through the capsule
 * "probe.compare.xlsx._cfloat.api": a Block (a float64 m x k array whose text is made on
 * first use, on whichever thread asks first) read without the GIL. */
#ifndef PROBE_CFLOAT_H
#define PROBE_CFLOAT_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    /* Whether obj is a Block (with the GIL). */
    int (*is_block)(PyObject *obj);
    /* How many numbers it holds (rows x columns) and the bytes its text takes at most. */
    Py_ssize_t (*count)(PyObject *block);
    Py_ssize_t (*bound)(PyObject *block);
    /* Its text, "[[a,b],[c,d]]" as orjson wrote a float64 array before 3.11.7 ("null" for
     * NaN and infinities), made on the first call: callable without the GIL, from any
     * thread (a second caller waits for the first). The text lives as long as the block. */
    const char *(*text)(PyObject *block, Py_ssize_t *len);
} probe_cfloat_api;

#define PROBE_CFLOAT_CAPSULE "probe.compare.xlsx._cfloat.api"

#ifdef __cplusplus
}
#endif

#endif

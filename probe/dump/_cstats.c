/* One-pass tensor statistics for probe: Max, Min, Mean and Norm of a contiguous CPU buffer.
 *
 * The pure-Python path (numpy/torch, probe/dump/stats.py) makes four reductions per tensor:
 * four passes over memory and four interpreter round trips, which is most of a dump's cost
 * on a small model. Here one loop reads each element once and keeps max, min, sum and sum
 * of squares, accumulated in double (the statistics are computed in float64, wider than
 * any input dtype). NaN is tracked on its own, so Max/Min are NaN when any element is,
 * as torch.max/min report.
 *
 * summarize(address, numel, kind) -> (Max, Min, Mean, Norm)
 *   address: tensor.data_ptr() of a contiguous CPU tensor the caller keeps alive
 *   kind:    one of the KIND_* codes below (stats.py maps torch dtypes to them)
 * Max/Min are float for floating kinds, int for integers, bool for bool.
 * summary(tensor, cache) -> the tensor's dump.json summary dict, or None (see below).
 * summarize_rows(address, rows, cols, kind) -> one [Max, Min, Mean, Norm] per row (floating kinds).
 *
 * Built as an optional extension: without a C compiler probe falls back to stats.py's
 * numpy/torch path, which computes the same statistics.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { KIND_F32, KIND_F64, KIND_BF16, KIND_F16, KIND_I64, KIND_I32, KIND_I16, KIND_I8,
       KIND_U8, KIND_BOOL, N_KINDS };

/* Above this many elements the GIL is released: other threads run while we read. */
#define GIL_FREE_NUMEL 65536

typedef struct {
    double max, min, sum, sumsq;
    int has_nan;
} facc;

typedef struct {
    int64_t max, min;
    double sum, sumsq;
} iacc;

static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) {                       /* inf / nan */
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {                   /* normal */
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {                  /* zero */
        bits = sign;
    } else {                                 /* subnormal: normalise */
        exp = 113;
        while (!(mant & 0x400u)) { mant <<= 1; exp--; }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float32, the common case: max/min in single-precision lanes, sum and sum of squares in
 * double lanes. Written with intrinsics because the compiler will not vectorise a max that
 * must keep NaN semantics; maxps/minps drop NaN, so a NaN sum triggers a scan for NaN
 * elements instead (inf - inf also gives NaN). Each call adds into *a, which the caller
 * has set up with init_acc. */
static void init_acc(facc *a) {
    a->max = -INFINITY; a->min = INFINITY; a->sum = 0.0; a->sumsq = 0.0; a->has_nan = 0;
}

static void reduce_f32_scalar(const float *p, Py_ssize_t n, facc *a) {
    float mx = (float)a->max, mn = (float)a->min;
    double s = 0.0, ss = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        float x = p[i];
        mx = x > mx ? x : mx;
        mn = x < mn ? x : mn;
        double d = (double)x;
        s += d;
        ss += d * d;
    }
    a->max = mx; a->min = mn; a->sum += s; a->sumsq += ss;
}

/* Vector lanes, stored to memory, folded into the accumulator. */
static void fold_lanes(const float *mx, const float *mn, int nf, const double *s, const double *q, int nd,
                       facc *a) {
    for (int k = 0; k < nf; k++) {
        a->max = mx[k] > a->max ? mx[k] : a->max;
        a->min = mn[k] < a->min ? mn[k] : a->min;
    }
    for (int k = 0; k < nd; k++) {
        a->sum += s[k];
        a->sumsq += q[k];
    }
}

#if defined(__SSE2__)
#include <immintrin.h>

static void reduce_f32_sse2(const float *p, Py_ssize_t n, facc *a) {
    __m128 mx = _mm_set1_ps((float)a->max), mn = _mm_set1_ps((float)a->min);
    __m128d s0 = _mm_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 x = _mm_loadu_ps(p + i);
        mx = _mm_max_ps(mx, x);
        mn = _mm_min_ps(mn, x);
        __m128d lo = _mm_cvtps_pd(x), hi = _mm_cvtps_pd(_mm_movehl_ps(x, x));
        s0 = _mm_add_pd(s0, lo);
        s1 = _mm_add_pd(s1, hi);
        q0 = _mm_add_pd(q0, _mm_mul_pd(lo, lo));
        q1 = _mm_add_pd(q1, _mm_mul_pd(hi, hi));
    }
    float fx[4], fn[4];
    double ds[2], dq[2];
    _mm_storeu_ps(fx, mx);
    _mm_storeu_ps(fn, mn);
    _mm_storeu_pd(ds, _mm_add_pd(s0, s1));
    _mm_storeu_pd(dq, _mm_add_pd(q0, q1));
    fold_lanes(fx, fn, 4, ds, dq, 2, a);
    reduce_f32_scalar(p + i, n - i, a);
}

#if defined(__GNUC__) || defined(__clang__)
#define HAVE_AVX2_VARIANT 1
__attribute__((target("avx2,fma"))) static void reduce_f32_avx2(const float *p, Py_ssize_t n, facc *a) {
    __m256 mx = _mm256_set1_ps((float)a->max), mn = _mm256_set1_ps((float)a->min);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x = _mm256_loadu_ps(p + i), y = _mm256_loadu_ps(p + i + 8);
        mx = _mm256_max_ps(mx, _mm256_max_ps(x, y));
        mn = _mm256_min_ps(mn, _mm256_min_ps(x, y));
        __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        __m256d y0 = _mm256_cvtps_pd(_mm256_castps256_ps128(y)), y1 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
        s0 = _mm256_add_pd(s0, x0);
        s1 = _mm256_add_pd(s1, x1);
        s2 = _mm256_add_pd(s2, y0);
        s3 = _mm256_add_pd(s3, y1);
        q0 = _mm256_fmadd_pd(x0, x0, q0);
        q1 = _mm256_fmadd_pd(x1, x1, q1);
        q2 = _mm256_fmadd_pd(y0, y0, q2);
        q3 = _mm256_fmadd_pd(y1, y1, q3);
    }
    float fx[8], fn[8];
    double ds[4], dq[4];
    _mm256_storeu_ps(fx, mx);
    _mm256_storeu_ps(fn, mn);
    _mm256_storeu_pd(ds, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    _mm256_storeu_pd(dq, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
    fold_lanes(fx, fn, 8, ds, dq, 4, a);
    reduce_f32_sse2(p + i, n - i, a);
}
#endif
static void (*reduce_f32_best)(const float *, Py_ssize_t, facc *) = reduce_f32_sse2;
#else
static void (*reduce_f32_best)(const float *, Py_ssize_t, facc *) = reduce_f32_scalar;
#endif

static void reduce_f32(const float *p, Py_ssize_t n, facc *a) {
    reduce_f32_best(p, n, a);
    if (a->sum != a->sum)   /* NaN element, or inf - inf */
        for (Py_ssize_t i = 0; i < n && !a->has_nan; i++)
            a->has_nan = p[i] != p[i];
}

static void reduce_f64(const double *p, Py_ssize_t n, facc *a) {
    double mx = -INFINITY, mn = INFINITY, s = 0.0, ss = 0.0;
    int nan = 0;   /* x != x in the loop: no intrinsics here, float64 tensors are rare */
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = p[i];
        mx = x > mx ? x : mx;
        mn = x < mn ? x : mn;
        nan |= x != x;
        s += x;
        ss += x * x;
    }
    a->max = mx; a->min = mn; a->sum = s; a->sumsq = ss; a->has_nan = nan;
}

/* bf16 / fp16: widened a block at a time into a float buffer, then the f32 loop. */
static void reduce_half(const uint16_t *p, Py_ssize_t n, int bf16, facc *a) {
    float buf[256];
    init_acc(a);
    for (Py_ssize_t i0 = 0; i0 < n; i0 += 256) {
        Py_ssize_t m = n - i0 < 256 ? n - i0 : 256;
        if (bf16)
            for (Py_ssize_t i = 0; i < m; i++) buf[i] = bf16_to_f32(p[i0 + i]);
        else
            for (Py_ssize_t i = 0; i < m; i++) buf[i] = f16_to_f32(p[i0 + i]);
        reduce_f32(buf, m, a);
    }
}

#define REDUCE_INT(NAME, T)                                              \
    static void NAME(const T *p, Py_ssize_t n, iacc *a) {               \
        T mx = p[0], mn = p[0];                                          \
        double s = 0.0, ss = 0.0;                                        \
        for (Py_ssize_t i = 0; i < n; i++) {                             \
            T x = p[i];                                                  \
            mx = x > mx ? x : mx;                                        \
            mn = x < mn ? x : mn;                                        \
            double d = (double)x;                                        \
            s += d;                                                      \
            ss += d * d;                                                 \
        }                                                                \
        a->max = (int64_t)mx; a->min = (int64_t)mn; a->sum = s; a->sumsq = ss; \
    }

REDUCE_INT(reduce_i64, int64_t)
REDUCE_INT(reduce_i32, int32_t)
REDUCE_INT(reduce_i16, int16_t)
REDUCE_INT(reduce_i8, int8_t)
REDUCE_INT(reduce_u8, uint8_t)

/* (Max, Min, Mean, Norm) of n elements of the given kind at ptr; NULL with an error set. */
static PyObject *reduce(const void *ptr, Py_ssize_t n, long kind) {
    int is_float = kind <= KIND_F16;
    facc f = {0};
    iacc i = {0};
    int release = n > GIL_FREE_NUMEL;
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    switch (kind) {
    case KIND_F32: init_acc(&f); reduce_f32((const float *)ptr, n, &f); break;
    case KIND_F64: reduce_f64((const double *)ptr, n, &f); break;
    case KIND_BF16: reduce_half((const uint16_t *)ptr, n, 1, &f); break;
    case KIND_F16: reduce_half((const uint16_t *)ptr, n, 0, &f); break;
    case KIND_I64: reduce_i64((const int64_t *)ptr, n, &i); break;
    case KIND_I32: reduce_i32((const int32_t *)ptr, n, &i); break;
    case KIND_I16: reduce_i16((const int16_t *)ptr, n, &i); break;
    case KIND_I8: reduce_i8((const int8_t *)ptr, n, &i); break;
    case KIND_U8:
    case KIND_BOOL: reduce_u8((const uint8_t *)ptr, n, &i); break;
    }
    if (release)
        PyEval_RestoreThread(ts);
    if (is_float) {
        if (f.has_nan)
            f.max = f.min = NAN;
        return Py_BuildValue("(dddd)", f.max, f.min, f.sum / (double)n, sqrt(f.sumsq));
    }
    double mean = i.sum / (double)n, norm = sqrt(i.sumsq);
    if (kind == KIND_BOOL)
        return Py_BuildValue("(NNdd)", PyBool_FromLong(i.max != 0), PyBool_FromLong(i.min != 0), mean, norm);
    return Py_BuildValue("(LLdd)", (long long)i.max, (long long)i.min, mean, norm);
}

static PyObject *summarize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "summarize(address, numel, kind)");
        return NULL;
    }
    void *ptr = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    long kind = PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (ptr == NULL || n <= 0 || kind < 0 || kind >= N_KINDS) {
        PyErr_SetString(PyExc_ValueError, "summarize: need a non-null address, numel > 0 and a known kind");
        return NULL;
    }
    return reduce(ptr, n, kind);
}

static PyObject *reduce_rows(const void *ptr, Py_ssize_t rows, Py_ssize_t cols, long kind);

/* summarize_rows(address, rows, cols, kind) -> [[Max, Min, Mean, Norm], ...]: each of `rows`
 * consecutive runs of `cols` elements of a floating kind reduced as summarize() reduces a
 * whole buffer (an inference step's per-token statistics: probe/inference/token_stats.py). */
static PyObject *summarize_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "summarize_rows(address, rows, cols, kind)");
        return NULL;
    }
    void *ptr = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t rows = PyLong_AsSsize_t(args[1]), cols = PyLong_AsSsize_t(args[2]);
    long kind = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (ptr == NULL || rows <= 0 || cols <= 0 || kind < 0 || kind > KIND_F16) {
        PyErr_SetString(PyExc_ValueError, "summarize_rows: need a non-null address, rows and cols > 0, a floating kind");
        return NULL;
    }
    return reduce_rows(ptr, rows, cols, kind);
}

/* The rows of summarize_rows(); NULL with an error set. */
static PyObject *reduce_rows(const void *ptr, Py_ssize_t rows, Py_ssize_t cols, long kind) {
    facc *acc = PyMem_Malloc(sizeof(facc) * (size_t)rows);
    if (acc == NULL)
        return PyErr_NoMemory();
    size_t width = kind == KIND_F64 ? 8 : kind == KIND_F32 ? 4 : 2;
    int release = rows * cols > GIL_FREE_NUMEL;
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const char *row = (const char *)ptr + (size_t)r * (size_t)cols * width;
        facc *f = &acc[r];
        init_acc(f);
        switch (kind) {
        case KIND_F32: reduce_f32((const float *)row, cols, f); break;
        case KIND_F64: reduce_f64((const double *)row, cols, f); break;
        case KIND_BF16: reduce_half((const uint16_t *)row, cols, 1, f); break;
        case KIND_F16: reduce_half((const uint16_t *)row, cols, 0, f); break;
        }
        if (f->has_nan)
            f->max = f->min = NAN;
    }
    if (release)
        PyEval_RestoreThread(ts);
    PyObject *out = PyList_New(rows);
    for (Py_ssize_t r = 0; out != NULL && r < rows; r++) {
        PyObject *item = Py_BuildValue("[dddd]", acc[r].max, acc[r].min, acc[r].sum / (double)cols,
                                       sqrt(acc[r].sumsq));
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, r, item);
    }
    PyMem_Free(acc);
    return out;
}

/* ---- summary(t, cache): a tensor's whole summary dict, for the common case ----------
 *
 * The collector's per-tensor Python (type and layout checks, the cache, the dict) costs
 * more than the reduction of a small tensor. For a plain, contiguous CPU tensor of a
 * known dtype it is done here; anything else returns None and takes stats.py's path.
 * ``setup()`` gives the torch objects this needs, once, from stats.py. */
static PyObject *plain_types;   /* tuple: torch.Tensor, torch.nn.Parameter */
static PyObject *kinds;         /* dict: torch.dtype -> KIND_* */
static PyObject *dtype_names;   /* dict: torch.dtype -> "torch.float32", ... */
static PyObject *strided;       /* torch.strided */
static PyObject *s_dtype, *s_is_cpu, *s_layout, *s_is_neg, *s_numel, *s_is_contiguous, *s_data_ptr,
    *s_shape, *s_requires_grad, *s_version, *s_is_inference, *k_type, *k_dtype, *k_shape, *k_max, *k_min, *k_mean,
    *k_norm, *k_requires_grad, *k_token_stats, *v_tensor;

static PyObject *setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "setup(plain_types, kinds, dtype_names, strided)");
        return NULL;
    }
    PyObject *olds[4] = {plain_types, kinds, dtype_names, strided};
    for (int k = 0; k < 4; k++)
        Py_INCREF(args[k]);
    plain_types = args[0]; kinds = args[1]; dtype_names = args[2]; strided = args[3];
    for (int k = 0; k < 4; k++)
        Py_XDECREF(olds[k]);
    Py_RETURN_NONE;
}

/* 1 / 0 for a bool attribute or no-argument method result; -1 with an error set */
static int truth_of(PyObject *t, PyObject *name, int call) {
    PyObject *v = call ? PyObject_CallMethodNoArgs(t, name) : PyObject_GetAttr(t, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* cache: dict id(t) -> (weakref to t, t._version, (Max, Min, Mean, Norm)), as stats.SummaryCache keeps it */
static PyObject *cached(PyObject *cache, PyObject *key, PyObject *t, PyObject *version) {
    PyObject *hit = PyDict_GetItemWithError(cache, key);   /* borrowed */
    if (hit == NULL || !PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 3)
        return NULL;
    PyObject *ref = PyTuple_GET_ITEM(hit, 0);
    if (!PyWeakref_Check(ref))
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0)
        return NULL;
    Py_XDECREF(target);   /* compared by address only; t itself is alive */
#else
    PyObject *target = PyWeakref_GetObject(ref);
#endif
    if (target != t)
        return NULL;
    int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(hit, 1), version, Py_EQ);
    if (same <= 0) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *value = PyTuple_GET_ITEM(hit, 2);
    if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 4)   /* summary() reads four items */
        return NULL;
    Py_INCREF(value);
    return value;
}

/* Statistics of a plain tensor of the given kind: from the cache when it holds this tensor
 * at this version, else reduced here (when it is a contiguous, non-negated, non-empty CPU
 * tensor) and stored. NULL without an error: not one this path can read. */
static PyObject *statistics_of(PyObject *t, PyObject *kind_obj, PyObject *cache, int *is_inference,
                               const void **data, Py_ssize_t *numel_out) {
    PyObject *key = PyLong_FromVoidPtr(t), *version = NULL, *value = NULL;
    *is_inference = 0;
    *data = NULL;
    *numel_out = 0;
    if (key == NULL)
        goto done;
    /* An inference tensor (torch.inference_mode) has no version counter, and reading
     * _version raises a C++ exception (~50 us, more than the reduction of a decode step's
     * tensor): asked first, it is reduced every time and never cached (an in-place write
     * would not show). */
    int inference = truth_of(t, s_is_inference, 1);
    if (inference < 0)
        goto done;
    *is_inference = inference;
    if (!inference) {
        version = PyObject_GetAttr(t, s_version);
        if (version == NULL)
            goto done;
        value = cached(cache, key, t, version);
        if (value != NULL || PyErr_Occurred())
            goto done;
    }
    if (truth_of(t, s_is_cpu, 0) != 1 || truth_of(t, s_is_neg, 1) != 0 || truth_of(t, s_is_contiguous, 1) != 1)
        goto done;
    PyObject *layout = PyObject_GetAttr(t, s_layout);
    Py_XDECREF(layout);   /* compared by address only: torch keeps layouts alive */
    if (layout != strided)
        goto done;
    PyObject *numel = PyObject_CallMethodNoArgs(t, s_numel), *addr = NULL;
    Py_ssize_t n = numel == NULL ? -1 : PyLong_AsSsize_t(numel);
    Py_XDECREF(numel);
    if (n <= 0)   /* empty: no statistics, stats.py's path says so */
        goto done;
    addr = PyObject_CallMethodNoArgs(t, s_data_ptr);
    void *ptr = addr == NULL ? NULL : PyLong_AsVoidPtr(addr);
    Py_XDECREF(addr);
    if (ptr == NULL)
        goto done;
    value = reduce(ptr, n, PyLong_AsLong(kind_obj));
    *data = ptr;
    *numel_out = n;
    if (value == NULL || version == NULL)
        goto done;
    PyObject *ref = PyWeakref_NewRef(t, NULL);
    PyObject *entry = ref == NULL ? NULL : PyTuple_Pack(3, ref, version, value);
    Py_XDECREF(ref);
    if (entry == NULL || PyDict_SetItem(cache, key, entry) < 0)
        PyErr_Clear();   /* not weak-referenceable: just not cached */
    Py_XDECREF(entry);
done:
    Py_XDECREF(key);
    Py_XDECREF(version);
    return value;
}

/* token_stats of an inference tensor whose leading dims are token_shape (a tuple of ints):
 * its rows reduced as summarize_rows() reduces them, as token_stats.row_reductions() would
 * (1); 0 when the shape does not match; -1 with an error set. */
static int add_token_rows(PyObject *out, PyObject *shape, PyObject *token_shape, const void *data,
                          Py_ssize_t numel, long kind) {
    Py_ssize_t k = PyTuple_GET_SIZE(token_shape), rows = 1;
    if (k == 0 || PyList_GET_SIZE(shape) < k)
        return 0;
    for (Py_ssize_t d = 0; d < k; d++) {
        Py_ssize_t want = PyLong_AsSsize_t(PyTuple_GET_ITEM(token_shape, d));
        Py_ssize_t have = PyLong_AsSsize_t(PyList_GET_ITEM(shape, d));
        if (PyErr_Occurred())
            return -1;
        if (want != have)
            return 0;
        rows *= want;
    }
    if (rows <= 0 || numel % rows)
        return 0;
    PyObject *values = reduce_rows(data, rows, numel / rows, kind);
    if (values == NULL)
        return -1;
    int bad = PyDict_SetItem(out, k_token_stats, values);
    Py_DECREF(values);
    return bad ? -1 : 1;
}

static PyObject *summary(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3 || !PyDict_Check(args[1]) || (nargs == 3 && args[2] != Py_None && !PyTuple_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "summary(tensor, cache dict[, token_shape tuple or None])");
        return NULL;
    }
    PyObject *token_shape = nargs == 3 && args[2] != Py_None ? args[2] : NULL;
    if (plain_types == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "summary: setup() was not called");
        return NULL;
    }
    PyObject *t = args[0], *cache = args[1];
    int plain = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(plain_types); k++)
        plain |= (PyObject *)Py_TYPE(t) == PyTuple_GET_ITEM(plain_types, k);
    if (!plain)
        Py_RETURN_NONE;
    PyObject *shape = NULL, *stats = NULL, *out = NULL, *dtype = PyObject_GetAttr(t, s_dtype);
    Py_XDECREF(dtype);   /* used as a key only: torch keeps dtype objects alive */
    PyObject *kind_obj = dtype == NULL ? NULL : PyDict_GetItemWithError(kinds, dtype);   /* borrowed */
    PyObject *dtype_name = dtype == NULL ? NULL : PyDict_GetItemWithError(dtype_names, dtype);
    if (kind_obj == NULL || dtype_name == NULL)
        goto fallback;
    int inference;
    const void *data;
    Py_ssize_t numel;
    stats = statistics_of(t, kind_obj, cache, &inference, &data, &numel);
    if (stats == NULL)
        goto fallback;
    PyObject *shape_obj = PyObject_GetAttr(t, s_shape);
    shape = shape_obj == NULL ? NULL : PySequence_List(shape_obj);
    Py_XDECREF(shape_obj);
    int requires_grad = truth_of(t, s_requires_grad, 0);
    if (shape == NULL || requires_grad < 0)
        goto fallback;
    out = PyDict_New();
    if (out == NULL || PyDict_SetItem(out, k_type, v_tensor) || PyDict_SetItem(out, k_dtype, dtype_name) ||
        PyDict_SetItem(out, k_shape, shape) || PyDict_SetItem(out, k_max, PyTuple_GET_ITEM(stats, 0)) ||
        PyDict_SetItem(out, k_min, PyTuple_GET_ITEM(stats, 1)) ||
        PyDict_SetItem(out, k_mean, PyTuple_GET_ITEM(stats, 2)) ||
        PyDict_SetItem(out, k_norm, PyTuple_GET_ITEM(stats, 3)) ||
        PyDict_SetItem(out, k_requires_grad, requires_grad ? Py_True : Py_False))
        Py_CLEAR(out);
    /* an inference tensor (never cached: reduced just now, data known) of a floating kind;
     * any other tensor's rows are token_stats.py's, cached as its summary is */
    long kind = PyLong_AsLong(kind_obj);
    if (out != NULL && token_shape != NULL && inference && data != NULL && kind <= KIND_F16 &&
            add_token_rows(out, shape, token_shape, data, numel, kind) < 0)
        Py_CLEAR(out);
    Py_DECREF(shape);
    Py_DECREF(stats);
    return out;
fallback:   /* not the common case, or an attribute refused: stats.py decides */
    PyErr_Clear();
    Py_XDECREF(shape);
    Py_XDECREF(stats);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"summarize", (PyCFunction)(void (*)(void))summarize, METH_FASTCALL,
     "summarize(address, numel, kind) -> (Max, Min, Mean, Norm) of a contiguous CPU buffer"},
    {"summarize_rows", (PyCFunction)(void (*)(void))summarize_rows, METH_FASTCALL,
     "summarize_rows(address, rows, cols, kind) -> [[Max, Min, Mean, Norm], ...] of a contiguous CPU buffer"},
    {"summary", (PyCFunction)(void (*)(void))summary, METH_FASTCALL,
     "summary(tensor, cache[, token_shape]) -> dump.json summary dict of a plain contiguous CPU tensor "
     "(an inference tensor's token_stats too), else None"},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL,
     "setup(plain_types, kinds, dtype_names, strided): the torch objects summary() needs"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cstats", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cstats(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject **names[] = {&s_dtype, &s_is_cpu, &s_layout, &s_is_neg, &s_numel, &s_is_contiguous, &s_data_ptr,
                          &s_shape, &s_requires_grad, &s_version, &s_is_inference, &k_type, &k_dtype, &k_shape, &k_max, &k_min,
                          &k_mean, &k_norm, &k_requires_grad, &k_token_stats, &v_tensor};
    const char *texts[] = {"dtype", "is_cpu", "layout", "is_neg", "numel", "is_contiguous", "data_ptr",
                           "shape", "requires_grad", "_version", "is_inference", "type", "dtype", "shape", "Max", "Min",
                           "Mean", "Norm", "requires_grad", "token_stats", "torch.Tensor"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if ((*names[k] = PyUnicode_InternFromString(texts[k])) == NULL) {
            Py_DECREF(m);
            return NULL;
        }
#ifdef HAVE_AVX2_VARIANT
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        reduce_f32_best = reduce_f32_avx2;
#endif
    if (PyModule_AddIntConstant(m, "KIND_F32", KIND_F32) || PyModule_AddIntConstant(m, "KIND_F64", KIND_F64) ||
        PyModule_AddIntConstant(m, "KIND_BF16", KIND_BF16) || PyModule_AddIntConstant(m, "KIND_F16", KIND_F16) ||
        PyModule_AddIntConstant(m, "KIND_I64", KIND_I64) || PyModule_AddIntConstant(m, "KIND_I32", KIND_I32) ||
        PyModule_AddIntConstant(m, "KIND_I16", KIND_I16) || PyModule_AddIntConstant(m, "KIND_I8", KIND_I8) ||
        PyModule_AddIntConstant(m, "KIND_U8", KIND_U8) || PyModule_AddIntConstant(m, "KIND_BOOL", KIND_BOOL)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

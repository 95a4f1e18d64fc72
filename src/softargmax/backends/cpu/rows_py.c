/* The small calls' entries of rows.c as a CPython extension module, _sa_cpu_rows (appended to rows.c when
 * Python's headers are found; softargmax.backends.cpu.rows builds and loads it).  Each function takes
 * Python integers (pointers as data_ptr() values, None for NULL) and floats, as the ctypes signatures of
 * sa_map_*, sa_jvp_*, sa_relu_fwd_*, sa_relu_bwd_*, sa_weights_ok_* and sa_scale_rows_* do, for a fraction of ctypes's cost per call (which is most of a small call's time).
 * The GIL is released around the C call, as ctypes does. */

static int sa_py_ptr(PyObject *o, void **out) {
    if (o == Py_None) { *out = NULL; return 0; }
    *out = PyLong_AsVoidPtr(o);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

#define SA_PY_ENTRIES(T, SUFFIX)                                                                  \
static PyObject *sa_py_map_##SUFFIX(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {  \
    void *z, *p, *s, *sc;                                                                        \
    (void)self;                                                                                  \
    if (nargs != 9) { PyErr_SetString(PyExc_TypeError, "map: 9 arguments"); return NULL; }      \
    if (sa_py_ptr(args[0], &z) || sa_py_ptr(args[5], &p) || sa_py_ptr(args[6], &s)             \
        || sa_py_ptr(args[7], &sc)) return NULL;                                                 \
    const long R = PyLong_AsLong(args[1]), k = PyLong_AsLong(args[2]);                           \
    const int kind = (int)PyLong_AsLong(args[3]);                                                \
    const double a = PyFloat_AsDouble(args[4]);                                                  \
    const int threads = (int)PyLong_AsLong(args[8]);                                             \
    if (PyErr_Occurred()) return NULL;                                                           \
    int ret;                                                                                     \
    Py_BEGIN_ALLOW_THREADS                                                                       \
    ret = sa_map_##SUFFIX((const T *)z, R, k, kind, a, (T *)p, (T *)s, (T *)sc, threads);        \
    Py_END_ALLOW_THREADS                                                                         \
    return PyLong_FromLong(ret);                                                                 \
}                                                                                                \
                                                                                                 \
static PyObject *sa_py_jvp_##SUFFIX(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {  \
    void *s, *v, *sc, *g;                                                                        \
    (void)self;                                                                                  \
    if (nargs != 8) { PyErr_SetString(PyExc_TypeError, "jvp: 8 arguments"); return NULL; }      \
    if (sa_py_ptr(args[0], &s) || sa_py_ptr(args[1], &v) || sa_py_ptr(args[2], &sc)            \
        || sa_py_ptr(args[3], &g)) return NULL;                                                  \
    const long R = PyLong_AsLong(args[4]), k = PyLong_AsLong(args[5]);                           \
    const double scale = PyFloat_AsDouble(args[6]);                                              \
    const int threads = (int)PyLong_AsLong(args[7]);                                             \
    if (PyErr_Occurred()) return NULL;                                                           \
    Py_BEGIN_ALLOW_THREADS                                                                       \
    sa_jvp_##SUFFIX((const T *)s, (const T *)v, (const T *)sc, (T *)g, R, k, scale, threads);   \
    Py_END_ALLOW_THREADS                                                                         \
    Py_RETURN_NONE;                                                                              \
}

SA_PY_ENTRIES(float, f32)
SA_PY_ENTRIES(double, f64)

/* alpha-ReLU's entries: relu_fwd(x, R, k, a, tau, taus, p, threads) and
 * relu_bwd(x, g, gs, R, k, a, tau, taus, gx, gtau, threads), as sa_relu_fwd_* and sa_relu_bwd_* */
#define SA_PY_RELU_ENTRIES(S, T, SUFFIX)                                                             \
static PyObject *sa_py_relu_fwd_##SUFFIX(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { \
    void *x, *taus, *p;                                                                          \
    (void)self;                                                                                  \
    if (nargs != 8) { PyErr_SetString(PyExc_TypeError, "relu_fwd: 8 arguments"); return NULL; } \
    if (sa_py_ptr(args[0], &x) || sa_py_ptr(args[5], &taus) || sa_py_ptr(args[6], &p)) return NULL; \
    const long R = PyLong_AsLong(args[1]), k = PyLong_AsLong(args[2]);                           \
    const double a = PyFloat_AsDouble(args[3]), tau = PyFloat_AsDouble(args[4]);                 \
    const int threads = (int)PyLong_AsLong(args[7]);                                             \
    if (PyErr_Occurred()) return NULL;                                                           \
    Py_BEGIN_ALLOW_THREADS                                                                       \
    sa_relu_fwd_##SUFFIX((const S *)x, R, k, a, tau, (const T *)taus, (S *)p, threads);          \
    Py_END_ALLOW_THREADS                                                                         \
    Py_RETURN_NONE;                                                                              \
}                                                                                                \
                                                                                                 \
static PyObject *sa_py_relu_bwd_##SUFFIX(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { \
    void *x, *g, *taus, *gx, *gtau;                                                              \
    (void)self;                                                                                  \
    if (nargs != 11) { PyErr_SetString(PyExc_TypeError, "relu_bwd: 11 arguments"); return NULL; } \
    if (sa_py_ptr(args[0], &x) || sa_py_ptr(args[1], &g) || sa_py_ptr(args[7], &taus)           \
        || sa_py_ptr(args[8], &gx) || sa_py_ptr(args[9], &gtau)) return NULL;                    \
    const long gs = PyLong_AsLong(args[2]), R = PyLong_AsLong(args[3]), k = PyLong_AsLong(args[4]); \
    const double a = PyFloat_AsDouble(args[5]), tau = PyFloat_AsDouble(args[6]);                 \
    const int threads = (int)PyLong_AsLong(args[10]);                                            \
    if (PyErr_Occurred()) return NULL;                                                           \
    Py_BEGIN_ALLOW_THREADS                                                                       \
    sa_relu_bwd_##SUFFIX((const S *)x, (const S *)g, gs, R, k, a, tau, (const T *)taus, (S *)gx, \
                         (double *)gtau, threads);                                               \
    Py_END_ALLOW_THREADS                                                                         \
    Py_RETURN_NONE;                                                                              \
}

SA_PY_RELU_ENTRIES(float, float, f32)
SA_PY_RELU_ENTRIES(double, double, f64)
SA_PY_RELU_ENTRIES(uint16_t, float, bf16)

/* the class-index loss's entries: weights_ok(w, k) -> bool and scale_rows(G, out, R, k, wrow, f, threads), as
 * sa_weights_ok_* and sa_scale_rows_* */
#define SA_PY_INDEX_ENTRIES(T, SUFFIX)                                                            \
static PyObject *sa_py_weights_ok_##SUFFIX(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { \
    void *w;                                                                                     \
    (void)self;                                                                                  \
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "weights_ok: 2 arguments"); return NULL; } \
    if (sa_py_ptr(args[0], &w)) return NULL;                                                     \
    const long k = PyLong_AsLong(args[1]);                                                       \
    if (PyErr_Occurred()) return NULL;                                                           \
    return PyBool_FromLong(sa_weights_ok_##SUFFIX((const T *)w, k));                             \
}                                                                                                \
                                                                                                 \
static PyObject *sa_py_scale_rows_##SUFFIX(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { \
    void *G, *out, *wrow;                                                                        \
    (void)self;                                                                                  \
    if (nargs != 7) { PyErr_SetString(PyExc_TypeError, "scale_rows: 7 arguments"); return NULL; } \
    if (sa_py_ptr(args[0], &G) || sa_py_ptr(args[1], &out) || sa_py_ptr(args[4], &wrow)) return NULL; \
    const long R = PyLong_AsLong(args[2]), k = PyLong_AsLong(args[3]);                           \
    const double f = PyFloat_AsDouble(args[5]);                                                  \
    const int threads = (int)PyLong_AsLong(args[6]);                                             \
    if (PyErr_Occurred()) return NULL;                                                           \
    Py_BEGIN_ALLOW_THREADS                                                                       \
    sa_scale_rows_##SUFFIX((const T *)G, (T *)out, R, k, (const T *)wrow, f, threads);           \
    Py_END_ALLOW_THREADS                                                                         \
    Py_RETURN_NONE;                                                                              \
}

SA_PY_INDEX_ENTRIES(float, f32)
SA_PY_INDEX_ENTRIES(double, f64)

static PyMethodDef sa_py_methods[] = {
    {"map_f32", (PyCFunction)(void (*)(void))sa_py_map_f32, METH_FASTCALL, "sa_map_f32"},
    {"map_f64", (PyCFunction)(void (*)(void))sa_py_map_f64, METH_FASTCALL, "sa_map_f64"},
    {"jvp_f32", (PyCFunction)(void (*)(void))sa_py_jvp_f32, METH_FASTCALL, "sa_jvp_f32"},
    {"jvp_f64", (PyCFunction)(void (*)(void))sa_py_jvp_f64, METH_FASTCALL, "sa_jvp_f64"},
    {"relu_fwd_f32", (PyCFunction)(void (*)(void))sa_py_relu_fwd_f32, METH_FASTCALL, "sa_relu_fwd_f32"},
    {"relu_fwd_f64", (PyCFunction)(void (*)(void))sa_py_relu_fwd_f64, METH_FASTCALL, "sa_relu_fwd_f64"},
    {"relu_bwd_f32", (PyCFunction)(void (*)(void))sa_py_relu_bwd_f32, METH_FASTCALL, "sa_relu_bwd_f32"},
    {"relu_bwd_f64", (PyCFunction)(void (*)(void))sa_py_relu_bwd_f64, METH_FASTCALL, "sa_relu_bwd_f64"},
    {"relu_fwd_bf16", (PyCFunction)(void (*)(void))sa_py_relu_fwd_bf16, METH_FASTCALL, "sa_relu_fwd_bf16"},
    {"relu_bwd_bf16", (PyCFunction)(void (*)(void))sa_py_relu_bwd_bf16, METH_FASTCALL, "sa_relu_bwd_bf16"},
    {"weights_ok_f32", (PyCFunction)(void (*)(void))sa_py_weights_ok_f32, METH_FASTCALL, "sa_weights_ok_f32"},
    {"weights_ok_f64", (PyCFunction)(void (*)(void))sa_py_weights_ok_f64, METH_FASTCALL, "sa_weights_ok_f64"},
    {"scale_rows_f32", (PyCFunction)(void (*)(void))sa_py_scale_rows_f32, METH_FASTCALL, "sa_scale_rows_f32"},
    {"scale_rows_f64", (PyCFunction)(void (*)(void))sa_py_scale_rows_f64, METH_FASTCALL, "sa_scale_rows_f64"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sa_py_module = {PyModuleDef_HEAD_INIT, "_sa_cpu_rows",
                                          "softargmax's CPU row solver: the small calls' entries", -1,
                                          sa_py_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__sa_cpu_rows(void) { return PyModule_Create(&sa_py_module); }

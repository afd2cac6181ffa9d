/*
 * The inner loop of the cost-model fit (exp_fit.py), in C: the moments of the model's shape
 * phi_s(u) = expm1(s (u - u0)) / s and its derivative in s against the centred costs at many span exponents s.
 *
 * It mirrors `exp_fit._moments` operation for operation (left-to-right sums, as Python 3.11's `sum` of floats
 * does; libm's exp and expm1, as `math.exp` and `math.expm1`; no fused multiply-adds, see setup.py), so both
 * give the same bits; the tests compare them. Optional: without a C compiler the pure-Python loop runs instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>

static double mean_of(const double *x, Py_ssize_t n) {
    double total = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) total += x[i];
    return total / (double)n;
}

static double dot(const double *x, const double *y, Py_ssize_t n) {
    double total = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) total += x[i] * y[i];
    return total;
}

/* exp_fit.PSI_TERMS: (j + 1) / (j + 2)! for j = 0..17, the series of psi(x) = (x e^x - expm1(x)) / x^2. */
static const double PSI_TERMS[18] = {
    0.5, 0.3333333333333333, 0.125, 0.03333333333333333, 0.006944444444444444, 0.0011904761904761906,
    0.00017361111111111112, 2.2045855379188714e-05, 2.48015873015873e-06, 2.505210838544172e-07,
    2.296443268665491e-08, 1.9270852604185937e-09, 1.4911969277048643e-10, 1.0706029224547743e-11,
    7.169215998581078e-13, 4.498331606952833e-14, 2.6552651846596585e-15, 1.4797143443923793e-16,
};
#define SERIES_BELOW 0.5

/* exp_fit._psi */
static double psi(double x) {
    if (x > -SERIES_BELOW) {
        double total = PSI_TERMS[17];
        for (int j = 16; j >= 0; j--) total = total * x + PSI_TERMS[j];
        return total;
    }
    return (x * exp(x) - expm1(x)) / (x * x);
}

/* work holds 2 n doubles. out gets cov(phi, y), var(phi) and the numerator of d corr / ds, as
 * exp_fit._moments. */
static void moments_at(const double *u, const double *yc, Py_ssize_t n, double s, double *work, double *out) {
    double *e_c = work, *de_c = work + n;
    double u0 = s > 0 ? 1.0 : 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = u[i] - u0;
        double x = s * v;
        e_c[i] = s != 0.0 ? expm1(x) / s : v;
        de_c[i] = v * v * psi(x);
    }
    double e_mean = mean_of(e_c, n), de_mean = mean_of(de_c, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        e_c[i] -= e_mean;
        de_c[i] -= de_mean;
    }
    double cov_ey = dot(e_c, yc, n), var_e = dot(e_c, e_c, n);
    out[0] = cov_ey;
    out[1] = var_e;
    out[2] = dot(de_c, yc, n) * var_e - cov_ey * dot(de_c, e_c, n);
}

/* A sequence of floats as a malloc'd array; *count gets its length. */
static double *floats_of(PyObject *obj, const char *name, Py_ssize_t *count) {
    PyObject *seq = PySequence_Fast(obj, name);
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    double *values = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!values) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        values[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (values[i] == -1.0 && PyErr_Occurred()) {
            free(values);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    *count = n;
    return values;
}

static PyObject *moments(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *u_obj, *yc_obj, *spans_obj, *result = NULL;
    if (!PyArg_ParseTuple(args, "OOO", &u_obj, &yc_obj, &spans_obj)) return NULL;
    Py_ssize_t n = 0, n_y = 0, n_s = 0;
    double *u = floats_of(u_obj, "u must be a sequence of floats", &n);
    double *yc = u ? floats_of(yc_obj, "y_c must be a sequence of floats", &n_y) : NULL;
    double *spans = yc ? floats_of(spans_obj, "spans must be a sequence of floats", &n_s) : NULL;
    double *work = spans ? malloc((size_t)(2 * n + 1) * sizeof(double)) : NULL;
    if (spans && !work) PyErr_NoMemory();
    if (work && (n != n_y || n == 0)) PyErr_SetString(PyExc_ValueError, "u and y_c need the same, non-zero length");
    else if (work && (result = PyList_New(n_s))) {
        for (Py_ssize_t k = 0; k < n_s; k++) {
            double out[3];
            moments_at(u, yc, n, spans[k], work, out);
            PyObject *item = Py_BuildValue("(ddd)", out[0], out[1], out[2]);
            if (!item) {
                Py_CLEAR(result);
                break;
            }
            PyList_SET_ITEM(result, k, item);
        }
    }
    free(work);
    free(spans);
    free(yc);
    free(u);
    return result;
}

static PyMethodDef fitcore_methods[] = {
    {"moments", moments, METH_VARARGS,
     "moments(u, y_c, spans): [(cov(e, y), var(e), dr/ds numerator) for s in spans], as exp_fit._moments."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fitcore_module = {PyModuleDef_HEAD_INIT, "_fitcore",
                                            "C inner loop of the cost-model fit.", -1, fitcore_methods};

PyMODINIT_FUNC PyInit__fitcore(void) { return PyModule_Create(&fitcore_module); }

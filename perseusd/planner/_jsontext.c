/*
 * The JSON text of frontier points, in C: the same bytes as `json.dumps` gives (default separators).
 *
 * A frontier of 8 x 96 has about 3,500 points of 1,536 clocks each (32 MB of JSON); encoding them one by one
 * in Python was about half of `perseusctl solve`. Only exact ints and finite exact floats are written here;
 * anything else raises TypeError/ValueError and the caller falls back to the Python encoder
 * (`frontier_text.py`), which is the reference these functions are tested against.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char *data;
    size_t len, cap;
    /* the last int written and its text: a row's clocks come in runs of one object (the inputs are alive
     * for the whole call, so an object's address is not reused meanwhile) */
    PyObject *last_int;
    size_t last_len;
    char last_text[24];
} Buf;

static int buf_reserve(Buf *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (!data) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const char *text, size_t len) {
    if (buf_reserve(b, len) < 0) return -1;
    memcpy(b->data + b->len, text, len);
    b->len += len;
    return 0;
}

#define PUT_LITERAL(b, s) buf_put((b), (s), sizeof(s) - 1)

/* An exact int, as int.__repr__ writes it (ints beyond 64 bits are refused). */
static int put_int(Buf *b, PyObject *obj) {
    if (obj == b->last_int) return buf_put(b, b->last_text, b->last_len);
    if (!PyLong_CheckExact(obj)) {
        PyErr_SetString(PyExc_TypeError, "expected an int");
        return -1;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "int too large");
        return -1;
    }
    if (value == -1 && PyErr_Occurred()) return -1;
    if (buf_reserve(b, 24) < 0) return -1;
    /* Digits from the right: snprintf is several times slower, and there are millions of clocks. */
    char digits[24];
    int k = 24;
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        digits[--k] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0) digits[--k] = '-';
    memcpy(b->data + b->len, digits + k, (size_t)(24 - k));
    b->len += (size_t)(24 - k);
    b->last_int = obj;
    b->last_len = (size_t)(24 - k);
    memcpy(b->last_text, digits + k, b->last_len);
    return 0;
}

/* An exact finite float, as float.__repr__ (and so json.dumps) writes it. */
static int put_float(Buf *b, PyObject *obj) {
    if (!PyFloat_CheckExact(obj)) {
        PyErr_SetString(PyExc_TypeError, "expected a float");
        return -1;
    }
    double value = PyFloat_AS_DOUBLE(obj);
    if (!isfinite(value)) {
        PyErr_SetString(PyExc_ValueError, "Out of range float values are not JSON compliant");
        return -1;
    }
    char *text = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!text) return -1;
    int rc = buf_put(b, text, strlen(text));
    PyMem_Free(text);
    return rc;
}

/* The node ids of every stage, flattened, checked against the number of clocks `n`. */
typedef struct {
    Py_ssize_t stages, *start, *ids;
} Orders;

static int orders_read(Orders *o, PyObject *orders, Py_ssize_t n) {
    o->stages = PyTuple_GET_SIZE(orders);
    o->start = PyMem_Calloc((size_t)o->stages + 1, sizeof(Py_ssize_t));
    o->ids = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    if (!o->start || !o->ids) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t s = 0; s < o->stages; s++) {
        PyObject *ids = PyTuple_GET_ITEM(orders, s);
        if (!PyTuple_Check(ids) || total + PyTuple_GET_SIZE(ids) > n) {
            PyErr_SetString(PyExc_TypeError, "stage orders must be tuples of node ids, one per clock");
            return -1;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ids); k++) {
            Py_ssize_t node = PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, k));
            if (node == -1 && PyErr_Occurred()) return -1;
            if (node < 0 || node >= n) {
                PyErr_SetString(PyExc_IndexError, "node id out of range");
                return -1;
            }
            o->ids[total++] = node;
        }
        o->start[s + 1] = total;
    }
    if (total != n) {
        PyErr_SetString(PyExc_ValueError, "the stage orders do not cover every clock");
        return -1;
    }
    return 0;
}

static void orders_free(Orders *o) {
    PyMem_Free(o->start);
    PyMem_Free(o->ids);
}

/*
 * `[[c, c, ...], [c, ...]]`: the rows of `clocks` (a tuple indexed by node) in stage order. Consecutive
 * points change few clocks: a stage whose clock objects are all the ones of the previous point (`prev`) is
 * copied from that point's text (at `row_at`/`row_len`, offsets into the buffer) instead of encoded again.
 */
static int put_node_rows(Buf *b, PyObject *clocks, PyObject *prev, const Orders *o, size_t *row_at,
                         size_t *row_len) {
    if (PUT_LITERAL(b, "[") < 0) return -1;
    for (Py_ssize_t s = 0; s < o->stages; s++) {
        if (s && PUT_LITERAL(b, ", ") < 0) return -1;
        int same = prev != NULL;
        for (Py_ssize_t k = o->start[s]; same && k < o->start[s + 1]; k++)
            same = PyTuple_GET_ITEM(clocks, o->ids[k]) == PyTuple_GET_ITEM(prev, o->ids[k]);
        if (same) {
            if (buf_reserve(b, row_len[s]) < 0) return -1;
            memcpy(b->data + b->len, b->data + row_at[s], row_len[s]);
            row_at[s] = b->len;
            b->len += row_len[s];
            continue;
        }
        size_t at = b->len;
        if (PUT_LITERAL(b, "[") < 0) return -1;
        for (Py_ssize_t k = o->start[s]; k < o->start[s + 1]; k++)
            if ((k > o->start[s] && PUT_LITERAL(b, ", ") < 0) || put_int(b, PyTuple_GET_ITEM(clocks, o->ids[k])) < 0)
                return -1;
        if (PUT_LITERAL(b, "]") < 0) return -1;
        row_at[s] = at;
        row_len[s] = b->len - at;
    }
    return PUT_LITERAL(b, "]");
}

static PyObject *buf_finish(Buf *b) {
    PyObject *text = PyUnicode_New((Py_ssize_t)b->len, 127);
    if (text) memcpy(PyUnicode_DATA(text), b->data, b->len);
    PyMem_Free(b->data);
    return text;
}

static PyObject *buf_fail(Buf *b) {
    PyMem_Free(b->data);
    return NULL;
}

/* clock_rows(rows): the JSON of a list of lists of exact ints. */
static PyObject *clock_rows(PyObject *Py_UNUSED(module), PyObject *rows) {
    Buf b = {NULL, 0, 0, NULL, 0, {0}};
    if (!PyList_CheckExact(rows)) {
        PyErr_SetString(PyExc_TypeError, "expected a list of lists");
        return NULL;
    }
    if (PUT_LITERAL(&b, "[") < 0) return buf_fail(&b);
    for (Py_ssize_t s = 0; s < PyList_GET_SIZE(rows); s++) {
        PyObject *row = PyList_GET_ITEM(rows, s);
        if (!PyList_CheckExact(row)) {
            PyErr_SetString(PyExc_TypeError, "expected a list of lists");
            return buf_fail(&b);
        }
        if ((s && PUT_LITERAL(&b, ", ") < 0) || PUT_LITERAL(&b, "[") < 0) return buf_fail(&b);
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(row); k++)
            if ((k && PUT_LITERAL(&b, ", ") < 0) || put_int(&b, PyList_GET_ITEM(row, k)) < 0)
                return buf_fail(&b);
        if (PUT_LITERAL(&b, "]") < 0) return buf_fail(&b);
    }
    if (PUT_LITERAL(&b, "]") < 0) return buf_fail(&b);
    return buf_finish(&b);
}

/*
 * frontier_points(rows, orders): the points of a frontier document, `{...}, {...}`, from rows of
 * (index, quant_time, time_s, model_energy_j, refined_energy_j, node_clocks) and the per-stage node orders.
 */
static PyObject *frontier_points(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *rows, *orders, *prev = NULL, *result = NULL;
    Buf b = {NULL, 0, 0, NULL, 0, {0}};
    Orders o = {0, NULL, NULL};
    size_t *row_at = NULL, *row_len = NULL;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &rows, &PyTuple_Type, &orders)) return NULL;
    Py_ssize_t n = -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 6 || !PyTuple_Check(PyTuple_GET_ITEM(row, 5)) ||
            (n >= 0 && PyTuple_GET_SIZE(PyTuple_GET_ITEM(row, 5)) != n)) {
            PyErr_SetString(PyExc_TypeError, "expected rows of 5 numbers and a tuple of clocks, all as long");
            return NULL;
        }
        n = PyTuple_GET_SIZE(PyTuple_GET_ITEM(row, 5));
    }
    if (n < 0) return PyUnicode_New(0, 127);
    if (orders_read(&o, orders, n) < 0) goto done;
    row_at = PyMem_Calloc((size_t)o.stages + 1, sizeof(size_t));
    row_len = PyMem_Calloc((size_t)o.stages + 1, sizeof(size_t));
    if (!row_at || !row_len) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i), *clocks = PyTuple_GET_ITEM(row, 5);
        if ((i && PUT_LITERAL(&b, ", ") < 0) || PUT_LITERAL(&b, "{\"index\": ") < 0 ||
            put_int(&b, PyTuple_GET_ITEM(row, 0)) < 0 || PUT_LITERAL(&b, ", \"quant_time\": ") < 0 ||
            put_int(&b, PyTuple_GET_ITEM(row, 1)) < 0 || PUT_LITERAL(&b, ", \"time_s\": ") < 0 ||
            put_float(&b, PyTuple_GET_ITEM(row, 2)) < 0 || PUT_LITERAL(&b, ", \"model_energy_j\": ") < 0 ||
            put_float(&b, PyTuple_GET_ITEM(row, 3)) < 0 || PUT_LITERAL(&b, ", \"refined_energy_j\": ") < 0 ||
            put_float(&b, PyTuple_GET_ITEM(row, 4)) < 0 || PUT_LITERAL(&b, ", \"clocks_mhz\": ") < 0 ||
            put_node_rows(&b, clocks, prev, &o, row_at, row_len) < 0 || PUT_LITERAL(&b, "}") < 0)
            goto done;
        prev = clocks;
    }
    result = buf_finish(&b);
    b.data = NULL;
done:
    PyMem_Free(b.data);
    PyMem_Free(row_at);
    PyMem_Free(row_len);
    orders_free(&o);
    return result;
}

static PyMethodDef jsontext_methods[] = {
    {"clock_rows", (PyCFunction)clock_rows, METH_O,
     "clock_rows(rows): json.dumps of a list of lists of ints (TypeError for anything else)."},
    {"frontier_points", (PyCFunction)frontier_points, METH_VARARGS,
     "frontier_points(rows, orders): the JSON of frontier points from (index, quant_time, time_s, "
     "model_energy_j, refined_energy_j, node_clocks) rows, clocks per stage in `orders`."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef jsontext_module = {PyModuleDef_HEAD_INIT, "_jsontext",
                                             "The JSON text of frontier points, in C.", -1, jsontext_methods};

PyMODINIT_FUNC PyInit__jsontext(void) { return PyModule_Create(&jsontext_module); }

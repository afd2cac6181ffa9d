/*
 * What the two C cores (_pdcore.c, _switchcore.c) share: taking in the arrays Python hands over, allocating and
 * freeing their work arrays, and declaring their types and modules. Included by both after <Python.h>; every function is static, so each extension
 * gets its own copy and neither links against the other. setup.py lists this file in both extensions' `depends`
 * (a change rebuilds them, and the source distribution carries it).
 */
#ifndef PERSEUSD_PLANNER_CSHARED_H
#define PERSEUSD_PLANNER_CSHARED_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define COUNT_OF(array) (sizeof(array) / sizeof((array)[0]))

/* Copies a C-contiguous buffer of 8-byte items into a new malloc'd block; *count gets the item count. */
static void *copy_buffer(PyObject *obj, const char *name, Py_ssize_t *count) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (view.itemsize != 8) {
        PyErr_Format(PyExc_TypeError, "%s: expected 8-byte items", name);
        PyBuffer_Release(&view);
        return NULL;
    }
    void *block = malloc(view.len > 0 ? (size_t)view.len : 8);
    if (!block) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(block, view.buf, (size_t)view.len);
    *count = view.len / 8;
    PyBuffer_Release(&view);
    return block;
}

/* copy_buffer of each of `count` objects (named in errors by names[k]) into *dst[k], its item count into
 * counts[k]; 0 with an exception set at the first that fails (the blocks copied so far stay set). */
static int copy_buffers(PyObject *const *objs, char *const *names, void **const *dst, Py_ssize_t *counts, int count) {
    for (int k = 0; k < count; k++)
        if (!(*dst[k] = copy_buffer(objs[k], names[k], &counts[k]))) return 0;
    return 1;
}

/* A zeroed array of `count` items (at least one, so that a successful allocation is never NULL). */
static void *zalloc(int64_t count, size_t size) { return calloc((size_t)(count > 0 ? count : 1), size); }

/* One work array: where its pointer goes, how many items, and of what size. */
typedef struct {
    void **dst;
    int64_t count;
    size_t size;
} WorkArray;

/* zalloc of every array of the table; 1 when all succeeded (those that did stay set, for the dealloc to free). */
static int alloc_arrays(const WorkArray *arrays, size_t count) {
    int ok = 1;
    for (size_t k = 0; k < count; k++) {
        *arrays[k].dst = zalloc(arrays[k].count, arrays[k].size);
        ok = ok && *arrays[k].dst;
    }
    return ok;
}

static void free_blocks(void *const *blocks, size_t count) {
    for (size_t k = 0; k < count; k++) free(blocks[k]);
}

/* The slots every type of the cores fills: a plain (static, not subclassable) type made by tp_new, set up by
 * `init` and freed by `dealloc`. For a type object's initialiser: {CORE_TYPE_SLOTS(...), any further slots}. */
#define CORE_TYPE_SLOTS(name, type, doc, init, dealloc, methods)                                                  \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = name, .tp_basicsize = sizeof(type), .tp_flags = Py_TPFLAGS_DEFAULT, \
        .tp_doc = doc, .tp_new = PyType_GenericNew, .tp_init = (initproc)init,                                  \
        .tp_dealloc = (destructor)dealloc, .tp_methods = methods

/* The module of `def` with each type added under the last part of its tp_name and its interface version as
 * `ABI` (the Python side refuses a build of other sources: `perseusd.planner.compiled`); NULL with an
 * exception set. */
static PyObject *module_with_types(PyModuleDef *def, PyTypeObject *const *types, size_t count, long abi) {
    PyObject *module = PyModule_Create(def);
    if (!module) return NULL;
    if (PyModule_AddIntConstant(module, "ABI", abi) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    for (size_t k = 0; k < count; k++)
        if (PyModule_AddType(module, types[k]) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    return module;
}

#endif

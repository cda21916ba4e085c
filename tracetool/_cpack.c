/*
 * tracetool._cpack: a packed sink's rows -> one Arrow record batch, in C.
 *
 * Why C: a live recording flushes every table ten times a second, a few dozen
 * rows each time. Turning such a flush into a record batch in Python costs
 * ~100 us per table whatever its size (numpy views and null checks, one
 * pyarrow call per column, RecordBatch.from_arrays checking them), about
 * 10 us per generated token on the writer's thread at 430 tok/s
 * (benchmarks/bench_flush.py). Here one pass over the rows
 * builds every column's buffers and hands them to pyarrow through the Arrow C
 * data interface (https://arrow.apache.org/docs/format/CDataInterface.html):
 * one import call, no copy.
 *
 *     pack(rows, ncols, kinds, strings, address) -> number of rows
 *
 * rows: a buffer of int64s, row after row (PackedSink's array('q')); kinds: one
 * byte per column, b'l' int64, b'i' int32, b's' string (an interner code);
 * strings: the interner's {code: str}; address: where to write the struct
 * ArrowArray (a struct array of the columns) that
 * pyarrow.RecordBatch._import_from_c(address, schema) then takes over.
 *
 * The same values as the Python path (tracetool.writer.PackedSink): INT_NULL
 * is null, an int32 column's value that does not fit is null (not wrapped), a
 * code the interner no longer has is null. Anything this cannot do (a string
 * that is not valid UTF-8, 2 GiB of text) raises, and the caller takes the
 * Python path for that flush. It runs with the GIL held from start to end, so
 * the interner's dict cannot change under it.
 *
 *     release(address)
 *
 * releases a struct that was not imported (an import that failed).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INT_NULL INT64_MIN

/* The Arrow C data interface's array struct (ABI-stable, from the specification). */
struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* One column: its struct, its buffer pointers and the memory they point to. */
typedef struct {
    struct ArrowArray array;
    const void *buffers[3];
    void *owned[3];
} Column;

/* The batch: the parent struct array's private data. */
typedef struct {
    Py_ssize_t ncols;
    const void *parent_buffers[1];
    struct ArrowArray **child_ptrs;
    Column *cols;
} Batch;

static void
release_child(struct ArrowArray *a)
{
    /* a child's memory belongs to its parent's Batch, freed there */
    a->release = NULL;
}

static void
free_batch(Batch *b)
{
    if (b == NULL)
        return;
    if (b->cols != NULL)
        for (Py_ssize_t j = 0; j < b->ncols; j++)
            for (int k = 0; k < 3; k++)
                free(b->cols[j].owned[k]);
    free(b->cols);
    free(b->child_ptrs);
    free(b);
}

static void
release_batch(struct ArrowArray *a)
{
    Batch *b = (Batch *)a->private_data;
    for (Py_ssize_t j = 0; j < b->ncols; j++)
        if (b->cols[j].array.release != NULL)
            b->cols[j].array.release(&b->cols[j].array);
    free_batch(b);
    a->release = NULL;
}

/* A validity bitmap for n rows, all valid; NULL when out of memory. */
static uint8_t *
new_bitmap(Py_ssize_t n)
{
    size_t bytes = (size_t)(n + 7) / 8;
    uint8_t *bits = malloc(bytes ? bytes : 1);
    if (bits != NULL)
        memset(bits, 0xff, bytes ? bytes : 1);
    return bits;
}

static int
int_column(Column *c, const int64_t *rows, Py_ssize_t n, Py_ssize_t ncols, Py_ssize_t j, int narrow)
{
    size_t width = narrow ? 4 : 8;
    void *data = malloc(n ? (size_t)n * width : 1);
    uint8_t *bits = new_bitmap(n);
    if (data == NULL || bits == NULL) {
        free(data);
        free(bits);
        PyErr_NoMemory();
        return -1;
    }
    int64_t nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = rows[i * ncols + j];
        int valid = v != INT_NULL && (!narrow || (v >= INT32_MIN && v <= INT32_MAX));
        if (!valid) {
            nulls++;
            bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
            v = 0;
        }
        if (narrow)
            ((int32_t *)data)[i] = (int32_t)v;
        else
            ((int64_t *)data)[i] = v;
    }
    if (nulls == 0) { /* no bitmap at all, as the Python path builds it */
        free(bits);
        bits = NULL;
    }
    c->owned[0] = bits;
    c->owned[1] = data;
    c->buffers[0] = bits;
    c->buffers[1] = data;
    c->array.n_buffers = 2;
    c->array.null_count = nulls;
    return 0;
}

static int
string_column(Column *c, const int64_t *rows, Py_ssize_t n, Py_ssize_t ncols, Py_ssize_t j, PyObject *strings)
{
    const char **ptrs = malloc(n ? (size_t)n * sizeof(char *) : 1);
    Py_ssize_t *lens = malloc(n ? (size_t)n * sizeof(Py_ssize_t) : 1);
    int32_t *offsets = malloc((size_t)(n + 1) * sizeof(int32_t));
    uint8_t *bits = new_bitmap(n);
    char *data = NULL;
    if (ptrs == NULL || lens == NULL || offsets == NULL || bits == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t nulls = 0;
    size_t total = 0;
    int64_t last_code = INT_NULL;
    const char *last_ptr = NULL;
    Py_ssize_t last_len = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t code = rows[i * ncols + j];
        const char *p = NULL;
        Py_ssize_t len = -1;
        if (code != INT_NULL && code == last_code) {
            p = last_ptr;
            len = last_len;
        }
        else if (code != INT_NULL) {
            PyObject *key = PyLong_FromLongLong(code);
            if (key == NULL)
                goto fail;
            PyObject *s = PyDict_GetItemWithError(strings, key); /* borrowed */
            Py_DECREF(key);
            if (s == NULL && PyErr_Occurred())
                goto fail;
            if (s != NULL) {
                if (!PyUnicode_Check(s)) {
                    PyErr_SetString(PyExc_TypeError, "an interned value is not a str");
                    goto fail;
                }
                p = PyUnicode_AsUTF8AndSize(s, &len); /* cached in the str; lives as long as it */
                if (p == NULL)
                    goto fail;
            }
            last_code = code;
            last_ptr = p;
            last_len = len;
        }
        if (p == NULL) { /* null, or forgotten by the interner */
            nulls++;
            bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
            len = 0;
        }
        ptrs[i] = p;
        lens[i] = len;
        total += (size_t)len;
        if (total > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of strings in one batch");
            goto fail;
        }
    }
    data = malloc(total ? total : 1);
    if (data == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    size_t at = 0;
    offsets[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (lens[i] > 0)
            memcpy(data + at, ptrs[i], (size_t)lens[i]);
        at += (size_t)lens[i];
        offsets[i + 1] = (int32_t)at;
    }
    free(ptrs);
    free(lens);
    if (nulls == 0) {
        free(bits);
        bits = NULL;
    }
    c->owned[0] = bits;
    c->owned[1] = offsets;
    c->owned[2] = data;
    c->buffers[0] = bits;
    c->buffers[1] = offsets;
    c->buffers[2] = data;
    c->array.n_buffers = 3;
    c->array.null_count = nulls;
    return 0;
fail:
    free(ptrs);
    free(lens);
    free(offsets);
    free(bits);
    free(data);
    return -1;
}

static PyObject *
pack(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t ncols;
    const char *kinds;
    Py_ssize_t nkinds;
    PyObject *strings;
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "y*ny#O!K:pack", &view, &ncols, &kinds, &nkinds, &PyDict_Type, &strings, &address))
        return NULL;
    Batch *b = NULL;
    if (ncols <= 0 || nkinds != ncols || view.len % (Py_ssize_t)(ncols * sizeof(int64_t)) != 0 || address == 0) {
        PyErr_SetString(PyExc_ValueError, "pack: rows, ncols and kinds do not agree");
        goto fail;
    }
    Py_ssize_t n = view.len / (Py_ssize_t)(ncols * sizeof(int64_t));
    const int64_t *rows = (const int64_t *)view.buf;
    b = calloc(1, sizeof(Batch));
    if (b == NULL || (b->cols = calloc((size_t)ncols, sizeof(Column))) == NULL
        || (b->child_ptrs = calloc((size_t)ncols, sizeof(struct ArrowArray *))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    b->ncols = ncols;
    for (Py_ssize_t j = 0; j < ncols; j++) {
        Column *c = &b->cols[j];
        int rc;
        if (kinds[j] == 's')
            rc = string_column(c, rows, n, ncols, j, strings);
        else if (kinds[j] == 'l' || kinds[j] == 'i')
            rc = int_column(c, rows, n, ncols, j, kinds[j] == 'i');
        else {
            PyErr_Format(PyExc_ValueError, "pack: unknown column kind %c", kinds[j]);
            rc = -1;
        }
        if (rc < 0)
            goto fail;
        c->array.length = n;
        c->array.buffers = c->buffers;
        c->array.release = release_child;
        b->child_ptrs[j] = &c->array;
    }
    b->parent_buffers[0] = NULL;
    struct ArrowArray *out = (struct ArrowArray *)(uintptr_t)address;
    out->length = n;
    out->null_count = 0;
    out->offset = 0;
    out->n_buffers = 1;
    out->n_children = ncols;
    out->buffers = b->parent_buffers;
    out->children = b->child_ptrs;
    out->dictionary = NULL;
    out->private_data = b;
    out->release = release_batch;
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);
fail:
    free_batch(b);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *
release(PyObject *Py_UNUSED(module), PyObject *arg)
{
    unsigned long long address = PyLong_AsUnsignedLongLong(arg);
    if (address == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    struct ArrowArray *a = (struct ArrowArray *)(uintptr_t)address;
    if (a != NULL && a->release != NULL)
        a->release(a);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS, "pack(rows, ncols, kinds, strings, address) -> rows: see the module's source."},
    {"release", release, METH_O, "release(address): release an ArrowArray that was not imported."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tracetool._cpack",
    "A packed sink's int64 rows to an Arrow record batch through the C data interface.", -1, methods,
};

PyMODINIT_FUNC
PyInit__cpack(void)
{
    return PyModule_Create(&module);
}

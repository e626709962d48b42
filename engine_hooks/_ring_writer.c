/* Compiled fast path of gatherwise.engine_hooks.recorder.RingRecorder.record(): the same bytes, written by one C call.
 *
 * Optional: built by `pip install` when a C compiler is there; RingRecorder falls back to its pure-Python
 * record() otherwise (GATHERWISE_PURE_PYTHON_RECORDER=1 forces the fallback). The ring format is defined in
 * gatherwise/shm_format/ring.py and docs/shm-format.md; tests/engine_hooks/test_recorder_native.py checks that both
 * writers produce identical files for the same calls, saturation included.
 *
 * Why C: inside the logits path the interpreter's work for one record (argument handling, ~60 bytecodes, a
 * struct pack and ten memoryview updates) costs more than the stores themselves once the path's tensor work
 * has evicted it from the caches.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* Layout constants; gatherwise.engine_hooks.recorder checks them against shm_format/ring.py at import (and uses
 * the Python writer where they differ). */
#define FORMAT_VERSION 2
#define HEADER_SIZE 512
#define RECORD_SIZE 88
#define WRITE_INDEX_OFFSET 56
#define COUNTERS_OFFSET 128
#define NUM_OPS 7
#define ROW_WORDS (1 + 2 * NUM_OPS)
#define NUM_MODE_ROWS 3
#define MODE_ALL_GATHER 0 /* gatherwise.modes.Mode, checked at import like the layout */
#define MODE_GATHER 1
#define MODE_SHARDED 2
#define OP_ALL_GATHER 0
#define OP_GATHER 1
#define OP_BROADCAST 2
#define OP_SAMPLE 3
#define OP_PATH 4
#define OP_SHARD_EXCHANGE 5
#define OP_SHARD_RESOLVE 6
#define TOPP_ROWS_OFFSET 80
#define TOPP_FALLBACK_ROWS_OFFSET 88
#define FLAG_BROADCAST 1u
#define FLAG_RESOLVE 2u
#define TAG_SHIFT 2
#define TAG_MASK 0x3Fu
#define FALLBACK_SHIFT 8
#define FALLBACK_MAX 0xFFFFFFll
#define BROADCAST_BYTES_PER_ROW 8
#define U32_MAX 0xFFFFFFFFll

/* By mode code (ring.MODE_OPS): the op of its first collective, and the flag of a record that ran its second
 * operation (a mode without one has always written FLAG_BROADCAST there). */
static const int MODE_FIRST_OP[NUM_MODE_ROWS] = {OP_ALL_GATHER, OP_GATHER, OP_SHARD_EXCHANGE};
static const uint32_t MODE_SECOND_FLAG[NUM_MODE_ROWS] = {FLAG_BROADCAST, FLAG_BROADCAST, FLAG_RESOLVE};

/* The CallMarks fields in the order record() reads them: gatherwise.engine_hooks.call_marks.MARKS, checked at
 * import. */
enum {
    CALL_INDEX, MODE, ROWS, EPOCH, NBYTES, T_START, COLL_START, COLL_END, SECOND_START, SECOND_END, SAMPLE_START,
    SAMPLE_END, T_END, RESOLVE_NBYTES, TOPP_ROWS, FALLBACK_ROWS, TAG, NUM_MARKS
};
static const char *const MARK_NAMES[NUM_MARKS] = {
    "call_index", "mode", "rows", "epoch", "nbytes", "t_start", "coll_start", "coll_end", "second_start",
    "second_end", "sample_start", "sample_end", "t_end", "resolve_nbytes", "topp_rows", "fallback_rows", "tag"};

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    PyTypeObject *marks_type;         /* CallMarks: record() reads its slots in place */
    Py_ssize_t mark_offset[NUM_MARKS]; /* where each slot lives in a CallMarks instance, in MARK_NAMES order */
    uint64_t capacity;
    uint32_t vocab;
    uint16_t rank;
    uint8_t dtype;
} Writer;

static inline uint32_t sat32(long long v) { return v < 0 ? 0u : (v > U32_MAX ? (uint32_t)U32_MAX : (uint32_t)v); }
static inline uint64_t pos(long long v) { return v < 0 ? 0u : (uint64_t)v; }

static inline void store32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void store64(char *p, uint64_t v) { memcpy(p, &v, 8); }

/* Header counters are single aligned 8-byte stores (readers may look at any time). */
static inline void add_word(uint64_t *w, uint64_t v) { __atomic_store_n(w, *w + v, __ATOMIC_RELAXED); }

/* The offset of each CallMarks slot, in MARK_NAMES order: every mark must be a plain object slot (a member
 * descriptor of T_OBJECT_EX), as `@dataclass(slots=True)` makes them. */
static int find_mark_offsets(Writer *self, PyObject *marks_type) {
    if (!PyType_Check(marks_type)) {
        PyErr_SetString(PyExc_TypeError, "Writer(): marks_type must be the CallMarks class");
        return -1;
    }
    for (int k = 0; k < NUM_MARKS; k++) {
        PyObject *descr = PyObject_GetAttrString(marks_type, MARK_NAMES[k]);
        if (descr == NULL) return -1;
        int is_slot = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                      ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (is_slot) self->mark_offset[k] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!is_slot) {
            PyErr_Format(PyExc_TypeError, "Writer(): CallMarks.%s is not a slot", MARK_NAMES[k]);
            return -1;
        }
    }
    Py_INCREF(marks_type);
    Py_XSETREF(self->marks_type, (PyTypeObject *)marks_type);
    return 0;
}

static int Writer_init(Writer *self, PyObject *args, PyObject *kwds) {
    PyObject *buffer, *marks_type;
    unsigned long long capacity;
    unsigned int vocab, rank, dtype;
    if (!PyArg_ParseTuple(args, "OKIIIO", &buffer, &capacity, &vocab, &rank, &dtype, &marks_type)) return -1;
    if (find_mark_offsets(self, marks_type) < 0) return -1;
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0) return -1;
    self->has_view = 1;
    if (capacity < 1 || (unsigned long long)self->view.len < HEADER_SIZE + capacity * RECORD_SIZE) {
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the ring it should hold");
        return -1;
    }
    self->capacity = capacity;
    self->vocab = vocab;
    self->rank = (uint16_t)rank;
    self->dtype = (uint8_t)dtype;
    return 0;
}

static PyObject *Writer_release(Writer *self, PyObject *unused) {
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    Py_RETURN_NONE;
}

static void Writer_dealloc(Writer *self) {
    Writer_release(self, NULL);
    Py_CLEAR(self->marks_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* record(marks): exactly RingRecorder.record(marks): one call's CallMarks, its slots read in place. */
static PyObject *Writer_record(Writer *self, PyObject *marks) {
    long long a[NUM_MARKS];
    if (Py_TYPE(marks) != self->marks_type) {
        PyErr_Format(PyExc_TypeError, "record() takes one call's CallMarks, got %.100s", Py_TYPE(marks)->tp_name);
        return NULL;
    }
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "record() on a closed ring");
        return NULL;
    }
    for (int k = 0; k < NUM_MARKS; k++) {
        PyObject *value = *(PyObject **)((char *)marks + self->mark_offset[k]);
        if (value == NULL) {
            PyErr_Format(PyExc_AttributeError, "record(): CallMarks.%s is not set", MARK_NAMES[k]);
            return NULL;
        }
        a[k] = PyLong_AsLongLong(value);
        if (a[k] == -1 && PyErr_Occurred()) return NULL;
    }
    long long call_index = a[CALL_INDEX], mode = a[MODE], rows = a[ROWS], epoch = a[EPOCH], nbytes = a[NBYTES];
    long long t_start = a[T_START], coll_start = a[COLL_START], coll_end = a[COLL_END];
    long long second_start = a[SECOND_START], second_end = a[SECOND_END];
    long long sample_start = a[SAMPLE_START], sample_end = a[SAMPLE_END], t_end = a[T_END];
    long long resolve_nbytes = a[RESOLVE_NBYTES], topp_rows = a[TOPP_ROWS], fallback_rows = a[FALLBACK_ROWS];
    long long tag = a[TAG];
    if (mode < 0 || mode >= NUM_MODE_ROWS || rows < 0 || rows > (long long)U32_MAX || epoch < 0 ||
        epoch > (long long)U32_MAX || nbytes < 0 || call_index < 0 || resolve_nbytes < 0 || topp_rows < 0 ||
        fallback_rows < 0 || tag < 0) {
        PyErr_SetString(PyExc_ValueError, "record(): mode, rows, epoch, byte counts or call_index out of range");
        return NULL;
    }
    char *base = (char *)self->view.buf;
    uint64_t *words = (uint64_t *)base;
    uint64_t seq = words[WRITE_INDEX_OFFSET / 8] + 1;
    long long coll_ns = coll_end - coll_start, sample_ns = sample_end - sample_start, path_ns = t_end - t_start;
    long long second_off = 0, second_ns = 0;
    uint32_t flags = 0;
    if (second_start) {
        flags = MODE_SECOND_FLAG[mode];
        second_off = second_start - t_start;
        second_ns = second_end - second_start;
    }
    flags |= ((uint32_t)tag & TAG_MASK) << TAG_SHIFT;
    if (fallback_rows) flags |= (uint32_t)(fallback_rows < FALLBACK_MAX ? fallback_rows : FALLBACK_MAX) << FALLBACK_SHIFT;
    char *r = base + HEADER_SIZE + ((seq - 1) % self->capacity) * RECORD_SIZE; /* ring.slot_offset */
    store64(r + 0, seq);
    store64(r + 8, (uint64_t)t_start);
    store64(r + 16, (uint64_t)call_index);
    store64(r + 24, (uint64_t)nbytes);
    store32(r + 32, (uint32_t)epoch);
    store32(r + 36, (uint32_t)rows);
    store32(r + 40, self->vocab);
    memcpy(r + 44, &self->rank, 2);
    r[46] = (char)(uint8_t)mode;
    r[47] = (char)self->dtype;
    store32(r + 48, sat32(coll_start - t_start));
    store32(r + 52, sat32(coll_ns));
    store32(r + 56, sat32(second_off));
    store32(r + 60, sat32(second_ns));
    store32(r + 64, sat32(sample_start - t_start));
    store32(r + 68, sat32(sample_ns));
    store32(r + 72, sat32(path_ns));
    store32(r + 76, flags);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    store64(r + 80, seq);

    uint64_t *row = words + COUNTERS_OFFSET / 8 + ROW_WORDS * mode;
    uint64_t total = (uint64_t)nbytes;
    int op = MODE_FIRST_OP[mode];
    add_word(row, 1);
    add_word(row + 1 + 2 * op, pos(coll_ns));
    add_word(row + 2 + 2 * op, (uint64_t)nbytes);
    if (flags & FLAG_BROADCAST) {
        uint64_t bcast_bytes = ((uint64_t)rows + 1) * BROADCAST_BYTES_PER_ROW; /* ring.broadcast_bytes */
        add_word(row + 1 + 2 * OP_BROADCAST, pos(second_ns));
        add_word(row + 2 + 2 * OP_BROADCAST, bcast_bytes);
        total += bcast_bytes;
    } else if (flags & FLAG_RESOLVE) {
        add_word(row + 1 + 2 * OP_SHARD_RESOLVE, pos(second_ns));
        add_word(row + 2 + 2 * OP_SHARD_RESOLVE, (uint64_t)resolve_nbytes);
        total += (uint64_t)resolve_nbytes;
    }
    if (topp_rows) {
        add_word(words + TOPP_ROWS_OFFSET / 8, (uint64_t)topp_rows);
        add_word(words + TOPP_FALLBACK_ROWS_OFFSET / 8, (uint64_t)fallback_rows);
    }
    add_word(row + 1 + 2 * OP_SAMPLE, pos(sample_ns));
    add_word(row + 1 + 2 * OP_PATH, pos(path_ns));
    add_word(row + 2 + 2 * OP_PATH, total);
    /* publish last: readers trust every seq <= write_index */
    __atomic_store_n(words + WRITE_INDEX_OFFSET / 8, seq, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyMethodDef Writer_methods[] = {
    {"record", (PyCFunction)Writer_record, METH_O,
     "record(marks): write one call's record and counters (as RingRecorder.record(marks))."},
    {"release", (PyCFunction)Writer_release, METH_NOARGS, "Release the buffer (before closing the mmap)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gatherwise.engine_hooks._ring_writer.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(buffer, capacity, vocab, rank, dtype_code, CallMarks): record() into a telemetry ring.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_methods = Writer_methods,
};

/* Adds `value` (a new reference, NULL on error) as m.name; steals the reference. */
static int add_tuple(PyObject *m, const char *name, PyObject *value) {
    if (value == NULL) return -1;
    if (PyModule_AddObject(m, name, value) < 0) {
        Py_DECREF(value);
        return -1;
    }
    return 0;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ring_writer", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__ring_writer(void) {
    if (PyType_Ready(&WriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "FORMAT_VERSION", FORMAT_VERSION);
    PyModule_AddIntConstant(m, "HEADER_SIZE", HEADER_SIZE);
    PyModule_AddIntConstant(m, "RECORD_SIZE", RECORD_SIZE);
    PyModule_AddIntConstant(m, "WRITE_INDEX_OFFSET", WRITE_INDEX_OFFSET);
    PyModule_AddIntConstant(m, "COUNTERS_OFFSET", COUNTERS_OFFSET);
    PyModule_AddIntConstant(m, "NUM_OPS", NUM_OPS);
    PyModule_AddIntConstant(m, "NUM_MODE_ROWS", NUM_MODE_ROWS);
    PyModule_AddIntConstant(m, "TOPP_ROWS_OFFSET", TOPP_ROWS_OFFSET);
    PyModule_AddIntConstant(m, "TAG_SHIFT", TAG_SHIFT);
    if (add_tuple(m, "MARKS", Py_BuildValue("(sssssssssssssssss)", MARK_NAMES[0], MARK_NAMES[1], MARK_NAMES[2],
                                            MARK_NAMES[3], MARK_NAMES[4], MARK_NAMES[5], MARK_NAMES[6],
                                            MARK_NAMES[7], MARK_NAMES[8], MARK_NAMES[9], MARK_NAMES[10],
                                            MARK_NAMES[11], MARK_NAMES[12], MARK_NAMES[13], MARK_NAMES[14],
                                            MARK_NAMES[15], MARK_NAMES[16])) < 0 ||
        add_tuple(m, "MODES", Py_BuildValue("((si)(si)(si))", "ALL_GATHER", MODE_ALL_GATHER, "GATHER", MODE_GATHER,
                                            "SHARDED", MODE_SHARDED)) < 0 ||
        add_tuple(m, "MODE_FIRST_OPS", Py_BuildValue("(iii)", MODE_FIRST_OP[0], MODE_FIRST_OP[1],
                                                     MODE_FIRST_OP[2])) < 0 ||
        add_tuple(m, "MODE_SECOND_FLAGS", Py_BuildValue("(III)", MODE_SECOND_FLAG[0], MODE_SECOND_FLAG[1],
                                                        MODE_SECOND_FLAG[2])) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

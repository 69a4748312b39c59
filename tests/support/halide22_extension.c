/* A Python extension module holding tests/support/halide22_pipelines.c's pipelines, as the
 * extension Halide 22 generates (-e python_extension) holds its pipeline: imported after the
 * shim, its library is served as Halide 22's (shim/calls/imported_libraries.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "h22ext", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_h22ext(void) {
    return PyModule_Create(&module);
}

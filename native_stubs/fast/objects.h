/* What the fast paths' Python types share (objects.c). Include after Python.h (with the
 * limited API the fast paths' files ask for) and shim_native.h. */
#ifndef SHIM_FAST_OBJECTS_H
#define SHIM_FAST_OBJECTS_H

/* The end of a tp_dealloc of the fast paths' types (heap types): free the object, drop the
 * type's reference. */
void shim_object_free(PyObject *self);

#endif

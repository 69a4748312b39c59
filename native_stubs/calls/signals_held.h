/* Signal handlers held from C (signals_held.c): while a thread is inside a hold, the shim's
 * handlers only note the signals that arrive, and its last release delivers them again, for
 * their handlers to run in Python, outside. The fast paths hold around a call (the device
 * callbacks of its run and its bookkeeping's Python code: a handler's exception landing before
 * that code's own deferred() would leave a use recorded for good, inside a callback it would
 * fail the call); so do the DLPack deleters and the shim's finalizers and context managers. */
#ifndef SHIM_CALLS_SIGNALS_HELD_H
#define SHIM_CALLS_SIGNALS_HELD_H

#include "shim_native.h"

void shim_signals_hold(void);
void shim_signals_release(void);

#endif

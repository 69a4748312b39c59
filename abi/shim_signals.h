/* Signal handlers held from C (native_stubs/calls/signals_held.c), as shim/native/interrupts.py sees them.
 * See abi/shim_calls.h for what every abi/shim_*.h header is.
 *
 * The shim's signal handlers run on the main thread; while it is inside a hold made in C (the
 * fast paths' calls, the finalizers, DLPack deleters, HeldContext's __enter__ and __exit__),
 * shim_signals_held() is nonzero there and a handler only notes its signal
 * (shim_signals_note); the thread's last release delivers it again. shim_signal_again(signum)
 * is Python's PyErr_SetInterruptEx: the signal's handler runs at Python's next check for
 * signals. */
int shim_signals_held(void);
void shim_signals_note(int signum);
void shim_signal_again(int signum);

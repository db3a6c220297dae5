/* The fused decoder's Python functions, added to the _kernels module by module.c. */
#ifndef HK_DECODER_MODULE_H
#define HK_DECODER_MODULE_H

#include <Python.h>
#include <pthread.h>

/* The lock around the pool and scratch buffers (module.c): every computing call holds it. */
extern pthread_mutex_t hk_compute;

/* Add decoder_new, decoder_forward and decoder_scratch_bytes to module; returns 0 or -1 with an exception. */
int hk_decoder_add_functions(PyObject *module);

#endif

/* The sampler's arithmetic over a vocabulary (top-k selection; top-p, min-p, temperature and the draw over a whole vocabulary), added to the _kernels module by module.c. */
#ifndef HK_SAMPLING_H
#define HK_SAMPLING_H

#include <Python.h>

/* Add top_k_sorted, sample_vocabulary and sample_top_k to module; returns 0 or -1 with an exception. */
int hk_sampling_add_functions(PyObject *module);

#endif

/* Host twins of bench/bench_kernels.cu for the simulator, and the LCG's closed form. */
#ifndef WEFT_BENCH_KERNELS_SIM_H
#define WEFT_BENCH_KERNELS_SIM_H

/** Registers the twins when the simulator is the loaded driver; returns 1 if it did, 0 on a GPU. */
int weft_bench_kernels_register_sim(void);

/** `iters` LCG steps of weft_bench_lcg as one affine map: x -> *mul * x + *add (mod 2^32). */
void weft_bench_lcg_map(unsigned iters, unsigned *mul, unsigned *add);

#endif /* WEFT_BENCH_KERNELS_SIM_H */

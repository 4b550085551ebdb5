/* The pipeline example's kernel on the host: its simulator twin and the reference result. */
#ifndef WEFT_EXAMPLES_PIPELINE_KERNELS_SIM_H
#define WEFT_EXAMPLES_PIPELINE_KERNELS_SIM_H

/** Registers the twin of pipeline_transform when the simulator is the loaded driver; returns 1 if
 * it did, 0 on a GPU. */
int pipeline_kernels_register_sim(void);

/** What pipeline_transform computes, as one affine map: `rounds` LCG steps send x to
 * *mul * x + *add (mod 2^32), so the host checks an element with one multiply-add. */
void pipeline_transform_map(unsigned rounds, unsigned *mul, unsigned *add);

#endif /* WEFT_EXAMPLES_PIPELINE_KERNELS_SIM_H */

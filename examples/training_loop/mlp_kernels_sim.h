#pragma once
/** Registers the MLP kernels' host twins when the simulator is the loaded driver (returns 1),
 * else does nothing (returns 0). */
int mlp_register_sim(void);

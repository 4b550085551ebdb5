/* The graph gate: a reader-writer gate per device whose readers never contend.
 *
 * Measured (tests/threads on an H200 and an H100, driver 580.159.04; tests/conformance/README.md,
 * "graph calls"): graph calls (launch, instantiate, upload, destroy, graph-memory allocation and
 * free nodes, the free of a graph output, cuDeviceGraphMemTrim) that ran while another thread was
 * inside a driver call that enqueues work (a kernel launch, an event record or wait, a copy, a
 * stream-ordered allocation or free) were followed by wrong results in many long runs;
 * serialising them against those calls made every run correct. So the process's driver table
 * (driver.c) runs each enqueueing call inside the gate's shared side, and the graph calls
 * (lib/mem/mem.h, WEFT__GRAPH_MEMORY) hold its exclusive side, one at a time.
 *
 * Shared side: one store and one load on a slot of the calling thread's own (Dekker-style, both
 * sequentially consistent), so readers on different threads share no cache line and never wait
 * for each other; they wait only while an exclusive holder is in. A slot belongs to one thread
 * while it lives and is taken over by a later thread once it exits. The shared side is held for
 * one driver call only and does not nest; nothing may block inside it on another thread (a
 * pageable host copy did: lib/runtime/runtime.h, "staging").
 *
 * The gate is per device: a driver call enters the shared side of the device it enqueues on (the
 * device of the current context: lib/core/driver.c), and a graph call locks the exclusive side of
 * its graph's device, so graph calls on one device never wait for enqueues on another. It was
 * process-wide until a deadlock on 2 x H200 (driver 580.159.04, 2026-11-27): an enqueue also
 * blocks inside the driver when its stream's launch queue is full (about 1,021 operations a
 * stream, tools/probes/probe_queue_depth). A thread per rank that posted an all-reduce and then
 * 20,000 memsets behind it blocked in the shared side while the all-reduce waited for the other
 * rank, whose thread waited for the exclusive side (a graph call) before posting its all-reduce
 * (tests/comm/test_comm_long.c test_min_full_queue_behind_an_all_reduce_meets_graph_calls). The
 * wrong results of "graph calls" were measured on one device; across devices the thread gate on
 * two devices (tests/threads/test_thread_gate, THREAD_GATE_DEVICES=2, 8 threads x 16,000
 * iterations, 2 x H100, three runs) failed 0 of 43 runs with this gate and 19 of 42 with none
 * (tools/run_gate_scope_gpu.sh; tests/conformance/README.md, "graph calls"). A thread whose full queue
 * waits for a thread of the SAME device that waits for that device's exclusive side still
 * deadlocks; weft posts nothing for other threads, so that takes a program whose own threads
 * wait for each other through the device (NCCL ranks sharing a device).
 *
 * Devices are bits of a 64-bit mask (ordinal % 64); WEFT__GATE_ALL covers every device (a call
 * whose device is not known).
 */
#ifndef WEFT_CORE_GATE_H
#define WEFT_CORE_GATE_H

#include <stdint.h>

/** A set of devices: bit (ordinal % 64). */
typedef uint64_t weft__gate_devices_t;
#define WEFT__GATE_ALL (~(weft__gate_devices_t)0)
/** The bit of device `ordinal`. */
static inline weft__gate_devices_t weft__gate_device(int ordinal) {
  return (weft__gate_devices_t)1 << ((unsigned)ordinal % 64u);
}

/** The gate's scope, from WEFT_GATE (lib/core/driver.c reads it when it loads the driver):
 * WEFT__GATE_PER_DEVICE (the default, "device"), WEFT__GATE_PROCESS ("process": every call in
 * one gate, as before 2026-11-27), WEFT__GATE_OFF ("off": no gate; for measurements only, it
 * gives wrong results on GPUs). Set before any call enters the gate. */
enum { WEFT__GATE_PER_DEVICE, WEFT__GATE_PROCESS, WEFT__GATE_OFF };
void weft__gate_set_scope(int scope);
/** The scope set (WEFT__GATE_PER_DEVICE unless set). */
int weft__gate_scope(void);

/** Enters the shared side of `devices` (waits while an exclusive holder of one of them is in). */
void weft__gate_enter(weft__gate_devices_t devices);
/** Leaves the shared side. */
void weft__gate_leave(void);
/** Takes the exclusive side of `devices`: waits until no thread is in the shared side of one of
 * them, and keeps new ones out until weft__gate_unlock(); the holder's own calls pass through the
 * shared side. Exclusive holders of a device are serialised (several devices are taken together,
 * once all of them are free). Not nested, and not from inside the shared side. */
void weft__gate_lock(weft__gate_devices_t devices);
void weft__gate_unlock(void);

#endif /* WEFT_CORE_GATE_H */

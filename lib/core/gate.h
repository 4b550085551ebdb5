/* The graph gate: a process-wide reader-writer gate whose readers never contend.
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
 * Open (2 x H200, driver 580.159.04, 2026-11-27): an enqueue also blocks inside the driver when
 * the device's launch queue is full. A thread per rank that posts an all-reduce and then 20,000
 * memsets behind it on one stream blocks in the gate's shared side while the all-reduce waits
 * for the other rank, whose thread waits for the exclusive side (a graph call) before it posts
 * its all-reduce: a deadlock (tests/comm/test_comm_long.c test_min_queue_behind_an_all_reduce_
 * meets_graph_calls with WEFT_TEST_QUEUE_OPS=20000; 500 memsets pass, 64 by default). The queue takes about 1,021
 * operations a stream, and streams beyond the device's 8 connections share room
 * (tools/probes/probe_queue_depth), so bounding the queued work of the streams that wait for
 * other threads would not do: another stream's enqueue can wait behind theirs on a shared
 * connection. The way out is a gate a blocked enqueue does not hold, not yet designed.
 */
#ifndef WEFT_CORE_GATE_H
#define WEFT_CORE_GATE_H

/** Enters the shared side (waits while an exclusive holder is in). */
void weft__gate_enter(void);
/** Leaves the shared side. */
void weft__gate_leave(void);
/** Takes the exclusive side: waits until no thread is in the shared side, and keeps new ones out
 * until weft__gate_unlock(); the holder's own calls pass through the shared side. Exclusive
 * holders are serialised. Not nested, and not from inside the shared side. */
void weft__gate_lock(void);
void weft__gate_unlock(void);

#endif /* WEFT_CORE_GATE_H */

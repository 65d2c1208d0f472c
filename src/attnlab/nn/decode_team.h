// The threads of one decoding step: one OpenMP parallel region per step (not one per operation),
// every thread running the whole step, splitting each product's tiles and attention's heads among
// them and meeting at a barrier where one's output is another's input.
//
// Why: a step of a small model is ~150 products and attention passes of a few µs each; waking the
// thread pool for each (at::parallel_for: a fork and a join, ~5-30 µs on these VMs) costs a large
// share of the step, while a barrier inside a live region costs ~1 µs (the threads spin). llama.cpp's
// CPU backend runs its graph the same way (ggml_graph_compute: one thread pool, a barrier per node).
// Work is split as at::parallel_for splits it (contiguous chunks of at least `grain` units), and
// every output element is computed by one thread in a fixed order: results do not depend on the
// number of threads.
// The barrier is the team's own (Barrier): it spins for about kSpins pauses (~50 µs; a step's waits
// are ~1-10 µs), then yields the CPU at every check. OpenMP's barrier (libgomp) spins up to
// GOMP_SPINCOUNT (300,000 polls, milliseconds) before it sleeps: with another busy process on the
// same cores, a thread waiting for a team mate that the scheduler has preempted spun away the time
// slice that mate needed, at each of a step's ~150 barriers (SmolLM2 decoding fell to 1.4 tok/s
// beside a build on 2 cores; with one busy loop beside it 2 threads ran slower than 1).
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>

namespace attnlab_decode {

// A sense-reversing barrier for n threads: the last to arrive releases the others; the writes each
// made before it are visible to all after it (acquire/release through `arrived_` and `phase_`).
class Barrier {
 public:
  static constexpr int kSpins = 2048;  // pauses before the first yield (~24 ns each on AMD EPYC Zen 3)

  void set_size(int n) { n_ = n; }  // before any wait

  // sense: the calling thread's own flag (0 at the start), flipped at each wait
  void wait(int& sense) {
    sense ^= 1;
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      arrived_.store(0, std::memory_order_relaxed);  // no one arrives again before phase_ changes
      phase_.store(sense, std::memory_order_release);
      return;
    }
    for (int spins = 0; phase_.load(std::memory_order_acquire) != sense; ++spins) {
      if (spins < kSpins)
        _mm_pause();
      else
        std::this_thread::yield();
    }
  }

 private:
  std::atomic<int> arrived_{0}, phase_{0};
  int n_ = 1;
};

struct Team {
  int tid = 0, nth = 1;
  bool per_op = false;  // not a team: this thread alone, each product and attention pass on at::parallel_for
  Barrier* barrier = nullptr;  // the team's, when nth > 1
  mutable int sense = 0;       // this thread's side of it

  bool leader() const { return tid == 0; }

  void sync() const {
    if (nth > 1) barrier->wait(sense);
  }

  // this thread's part [begin, end) of [0, n) (empty when it has none)
  std::pair<int64_t, int64_t> share(int64_t n, int64_t grain) const {
    if (n <= 0) return {0, 0};
    const int64_t chunks = std::min<int64_t>(nth, (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
    const int64_t size = (n + chunks - 1) / chunks;
    const int64_t begin = std::min<int64_t>(n, tid * size);
    return {begin, tid < chunks ? std::min<int64_t>(n, begin + size) : begin};
  }
};

// body(team) on each of torch's intra-op threads (at::get_num_threads()), or on this thread alone
// (one thread; or per_op: the products split over at::parallel_for one by one, the form before teams).
template <class F>
void run_team(F&& body, bool per_op) {
  const int threads = at::get_num_threads();
  if (threads <= 1 || per_op || omp_in_parallel()) {
    body(Team{0, 1, per_op && threads > 1});
    return;
  }
  Barrier barrier;
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    barrier.set_size(omp_get_num_threads());  // the threads the region has (OpenMP may give fewer)
    body(Team{omp_get_thread_num(), omp_get_num_threads(), false, &barrier});
  }
}

}  // namespace attnlab_decode

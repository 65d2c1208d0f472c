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
#pragma once

#include <ATen/Parallel.h>
#include <omp.h>
#include <algorithm>
#include <cstdint>
#include <utility>

namespace attnlab_decode {

struct Team {
  int tid = 0, nth = 1;
  bool per_op = false;  // not a team: this thread alone, each product and attention pass on at::parallel_for

  bool leader() const { return tid == 0; }

  void sync() const {
    if (nth > 1) {
#pragma omp barrier
    }
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
#pragma omp parallel num_threads(threads)
  { body(Team{omp_get_thread_num(), omp_get_num_threads()}); }
}

}  // namespace attnlab_decode

// Runs work(i) for i in [0, n) on `threads` threads and hands every result to
// consume(i, result) on the calling thread in index order, so the output is the same
// for any thread count. At most `max_ahead` results wait to be consumed (bounds memory).
// An exception in work() or consume() stops the pool and is rethrown here.
#pragma once
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace flashgpt {

template <class Result, class Work, class Consume>
void run_ordered(size_t n, int threads, size_t max_ahead, Work&& work, Consume&& consume) {
  std::mutex mu;
  std::condition_variable changed;
  std::map<size_t, Result> done;  // finished, not yet consumed
  size_t next_item = 0, consumed = 0;
  std::exception_ptr error;

  auto worker = [&] {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> lock(mu);
        changed.wait(lock, [&] { return error || next_item >= n || next_item < consumed + max_ahead; });
        if (error || next_item >= n) return;
        i = next_item++;
      }
      try {
        Result r = work(i);
        std::lock_guard<std::mutex> lock(mu);
        done.emplace(i, std::move(r));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
      changed.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);

  try {
    while (consumed < n) {
      Result r;
      {
        std::unique_lock<std::mutex> lock(mu);
        changed.wait(lock, [&] { return error || done.count(consumed); });
        if (error) break;
        r = std::move(done.at(consumed));
        done.erase(consumed);
      }
      consume(consumed, std::move(r));
      {
        std::lock_guard<std::mutex> lock(mu);
        ++consumed;
      }
      changed.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::current_exception();
  }
  changed.notify_all();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flashgpt

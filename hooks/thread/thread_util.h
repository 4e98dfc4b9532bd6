// Small helpers shared by the thread hook's two user-side backends (agent_hook.cpp,
// scx_hook.cpp) and what they share (thread_hook.cpp).
#pragma once

#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>

namespace syrup::thread {

// Starts `f` on a thread with every signal blocked. A thread made while syrupd adopts
// policies at start exists before syrupd blocks SIGTERM for its signalfd; unblocked there,
// a SIGTERM to syrupd could be delivered to it and kill the process (default action)
// instead of shutting it down in order.
template <class F>
std::thread signal_free_thread(F f) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  std::thread t(std::move(f));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return t;
}

// Waits up to `ms` for the process behind `pidfd` to exit. True if it did.
inline bool wait_pidfd(int pidfd, int ms) {
  pollfd pf{pidfd, POLLIN, 0};
  return poll(&pf, 1, ms) == 1;
}

inline uint64_t now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace syrup::thread

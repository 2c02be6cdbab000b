#include "experiments/sim/engine/engine.h"

#include <utility>

namespace gradsync::sim {

void Engine::Run() {
  while (!q_.empty()) {
    Ev e = std::move(const_cast<Ev&>(q_.top()));
    q_.pop();
    now_ = e.t;
    ++events_;
    e.f();
  }
}

}  // namespace gradsync::sim

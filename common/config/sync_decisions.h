// The decisions that shape a run's gradient sync, made here once: gradsync-worker, the Python
// frontend (both through worker/sync/sync_factory.h) and the simulator (experiments/sim/) call them,
// so that the simulator times the job the real code would run.
//
//   RoundSchedule rounds{.every = c.sync_every(), .total_steps = steps};
//   if (rounds.EndsRound(step)) ...             // the round's exchange follows this step
//   OverlapFacts f{.requested = OverlapOf(c, oversubscribed), .compressed = ..., ...};
//   if (PsOverlaps(f)) ...                      // PsOverlapSync, else PsSync
//   RowCacheBound(c.row_cache(), mode, s)      // how long a worker's cached table row serves
#pragma once

#include <cstdint>
#include <string>

namespace gradsync {

// Rounds of local steps (--sync-every H > 0: local SGD, DiLoCo): round r holds steps
// [r·H, (r+1)·H); the last may be shorter when the run's length is no multiple of H.
struct RoundSchedule {
  int64_t every = 0;        // H (>= 1)
  int64_t total_steps = 0;  // the run's length; 0: not known (the caller ends the last round)

  int64_t Round(int64_t step) const { return step / every; }
  // Whether `step` is its round's last: the round's exchange follows its update.
  bool EndsRound(int64_t step) const { return (step + 1) % every == 0 || step + 1 == total_steps; }
};

// What decides whether a worker's communication overlaps its computation.
struct OverlapFacts {
  bool requested = false;          // OverlapOf(config, oversubscribed): --overlap, or its default
  bool compressed = false;         // the gradient travels through a codec (compressed after backward)
  bool sparse = false;             // a tensor of the model is sparse
  bool on_device = false;          // the model computes on a GPU
  bool per_tensor_params = false;  // the model's forward waits for each layer's parameters (Model::waits_for_params)
  bool straggles = false;          // a straggler's delay is slept between backward and the push
  bool rounds = false;             // rounds of local steps: one exchange after the round's last step
  int workers = 1;                 // the ranks that average (all-reduce)
  int zero = 0;                    // ZeRO stage (all-reduce)
};

// Parameter server: pulls per tensor in forward order and pushes per tensor as backward ends
// (PsOverlapSync) for a dense CPU model whose forward waits for each layer, raw pushes, no
// straggler and no rounds.
bool PsOverlaps(const OverlapFacts& f);
// Whether a worker that asked for overlap is refused it (PsOverlaps false for a reason other than
// rounds, which exchange after the step by construction): worth a line in its log.
bool PsOverlapRefused(const OverlapFacts& f);
// All-reduce: buckets averaged on a communication thread during backward (OverlappedReducer) for
// a dense, uncompressed CPU gradient over more than one rank, no rounds and ZeRO other than 1
// (stage 1 reduce-scatters after backward).
bool AllreduceOverlaps(const OverlapFacts& f);

// The bound of a PS worker's row cache (worker/ps/row_cache.h) for a job in `mode` ("bsp", "ssp"
// or "asp") with ssp bound `staleness`, when the run asks for the cache (`requested`): ssp's s for
// s >= 1; -1 (off: every read asks the shards) otherwise: bsp and ssp(0) would serve a row only
// at the clock it was pulled at, asp has no bound to keep a row against.
int RowCacheBound(bool requested, const std::string& mode, int staleness);

}  // namespace gradsync

// The run configuration: Validate() catches every class of contradiction (one case each, in
// both namings), the flag table round-trips, and the job fingerprint holds exactly the settings
// the workers of a job must agree on.
#include "common/config/train_config.h"

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/config/cluster.h"
#include "common/config/train_flags.h"

namespace gradsync {
namespace {

config::TrainConfig Config(const std::string& text) {
  config::TrainConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c)) << text;
  return c;
}

TEST(TrainConfigTest, AWorkerWithoutARankTakesItsLaunchersInnermostFirst) {
  config::TrainConfig ps;
  ps.set_mode(config::BSP);
  config::TrainConfig local;
  local.set_mode(config::LOCAL);
  std::map<std::string, std::string> vars;
  const EnvLookup env = [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  auto rank_of = [&](const config::TrainConfig& c, int given) {
    config::WorkerProcess p;
    if (given >= 0) p.set_rank(given);
    EXPECT_TRUE(TakeLauncherRank(c, &p, env).ok());
    return p.has_rank() ? p.rank() : -1;
  };
  EXPECT_EQ(rank_of(ps, -1), -1);    // no launcher: the scheduler assigns
  vars = {{"RANK", "3"}};
  EXPECT_EQ(rank_of(ps, -1), 3);     // torchrun's
  EXPECT_EQ(rank_of(ps, 1), 1);      // --rank wins
  EXPECT_EQ(rank_of(local, -1), -1); // local mode has no rank (Validate refuses one)
  // torchrun (4 processes) under srun (1 task per node): the innermost launcher's rank.
  vars = {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}};
  EXPECT_EQ(rank_of(ps, -1), 3);
  vars = {{"SLURM_PROCID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "8"}};
  EXPECT_EQ(rank_of(ps, -1), 5);     // Slurm's, inside a step
  vars.erase("SLURM_STEP_ID");
  EXPECT_EQ(rank_of(ps, -1), -1);    // a batch script's SLURM_PROCID is not a task's rank
  // The launcher's rank on the host picks the GPU, also when the rank was given.
  vars = {{"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}};
  config::WorkerProcess given;
  given.set_rank(4);
  ASSERT_TRUE(TakeLauncherRank(ps, &given, env).ok());
  EXPECT_EQ(given.rank(), 4);
  EXPECT_EQ(given.local_rank(), 2);
  vars = {{"RANK", "x"}};
  config::WorkerProcess p;
  const Status junk = TakeLauncherRank(ps, &p, env);
  EXPECT_EQ(junk.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(junk.message().find("RANK='x'"), std::string::npos) << junk.message();
}

TEST(TrainConfigTest, DefaultsAreValid) {
  EXPECT_TRUE(Validate(config::TrainConfig()).empty()) << JoinErrors(Validate(config::TrainConfig()));
  for (const char* ok : {"mode: BSP", "mode: SSP staleness: 3", "mode: ASP staleness_aware_lr: true",
                         "mode: ALLREDUCE bucket_mib: 4 overlap: false checkpoint_dir: \"/tmp\" resume: true",
                         "model: \"sparse_logreg\"", "model: \"softmax\" dataset: \"blobs\"",
                         "mode: BSP compress: \"topk:0.01\" momentum_correction: true compress_pull: true",
                         "lr_scaling: \"linear\" base_batch: 32 warmup_epochs: 1", "straggle: \"x:3\" straggle_seed: 4",
                         "optimizer: \"adam\"", "optimizer: \"adam\" momentum: 0 weight_decay: 0.01",
                         "mode: ASP optimizer: \"adam\" adam_beta1: 0.8 adam_beta2: 0.99 adam_eps: 1e-6",
                         "mode: BSP device: \"cuda\" optimizer: \"adam\"", "optimizer: \"sgd\" momentum: 0.5",
                         "optimizer: \"lars\"", "mode: ALLREDUCE optimizer: \"lars\" momentum: 0 trust_coefficient: 0.02 weight_decay: 1e-4",
                         "optimizer: \"lamb\"", "mode: SSP optimizer: \"lamb\" momentum: 0 adam_beta2: 0.99 adam_eps: 1e-6 weight_decay: 0.01",
                         "mode: BSP device: \"cuda\" optimizer: \"lars\"", "mode: ASP sync_every: 4",
                         "mode: ALLREDUCE sync_every: 16 outer_lr: 0.7 outer_momentum: 0.9 outer_nesterov: true optimizer: \"adam\" momentum: 0",
                         "mode: ASP delay_compensation: 0.5", "mode: SSP delay_compensation: 0 delay_compensation_adaptive: true",
                         "model: \"dlrm\"", "mode: BSP model: \"dlrm\" table_dim: 32 table_optimizer: \"adagrad\" click_ids: 0",
                         "mode: ASP model: \"dlrm\" dataset: \"click-log\" table_optimizer: \"adam\" table_rows: 1000",
                         "mode: ALLREDUCE model: \"dlrm\" table_optimizer: \"adagrad\" bucket_mib: 1"}) {
    EXPECT_TRUE(Validate(Config(ok)).empty()) << ok << ": " << JoinErrors(Validate(Config(ok)));
  }
}

struct Contradiction {
  const char* name;
  const char* config;  // text format
  const char* field;   // the field the first error names
  const char* flags;   // part of its message in flag naming
  const char* spec;    // part of its message in spec naming
};

class ValidateTest : public ::testing::TestWithParam<Contradiction> {};

TEST_P(ValidateTest, NamesTheFieldInBothNamings) {
  const Contradiction& c = GetParam();
  const config::TrainConfig config = Config(c.config);
  auto flags = Validate(config, Naming::kFlags);
  ASSERT_FALSE(flags.empty()) << c.config;
  EXPECT_EQ(flags[0].field, c.field) << JoinErrors(flags);
  EXPECT_NE(flags[0].message.find(c.flags), std::string::npos) << flags[0].message;
  auto spec = Validate(config, Naming::kSpec);
  ASSERT_EQ(spec.size(), flags.size());
  EXPECT_NE(spec[0].message.find(c.spec), std::string::npos) << spec[0].message;
  for (const auto& e : spec) EXPECT_EQ(e.message.find("--"), std::string::npos) << e.message;  // no flag syntax
  EXPECT_EQ(JoinErrors(flags).find('\n'), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Classes, ValidateTest,
    ::testing::Values(
        // The mode and what belongs to some modes only.
        Contradiction{"NoMode", "mode: MODE_UNSPECIFIED", "mode", "--mode must be local|bsp", "mode must be local|bsp"},
        Contradiction{"StalenessOutsideSsp", "mode: BSP staleness: 2", "staleness", "--staleness applies to --mode=ssp only", "staleness applies to mode SSP only"},
        Contradiction{"NegativeStaleness", "mode: SSP staleness: -1", "staleness", "--staleness must be in [0, 1000000]", "staleness must be in"},
        Contradiction{"RecoveryOutsidePs", "mode: ALLREDUCE recovery_timeout: 5", "recovery_timeout", "--recovery-timeout applies to the PS modes", "recovery_timeout applies to the PS modes"},
        Contradiction{"PushPartOutsidePs", "push_part_mib: 1", "push_part_mib", "--push-part-mib applies to the PS modes", "push_part_mib applies"},
        Contradiction{"OverlapLocal", "overlap: true", "overlap", "--overlap applies to the modes that join a job only", "overlap applies"},
        Contradiction{"BusyPollLocal", "busy_poll_ms: 1", "busy_poll_ms", "--busy-poll-ms applies to the modes that join a job only", "busy_poll_ms applies"},
        Contradiction{"NegativeBusyPoll", "mode: ASP busy_poll_ms: -1", "busy_poll_ms", "--busy-poll-ms must be in [0, 1000]", "busy_poll_ms must be in"},
        Contradiction{"LongBusyPoll", "mode: ALLREDUCE busy_poll_ms: 1001", "busy_poll_ms", "--busy-poll-ms must be in [0, 1000]", "busy_poll_ms must be in"},
        Contradiction{"ZeroPushPart", "mode: BSP push_part_mib: 0", "push_part_mib", "--push-part-mib must be in (0, 1024]", "push_part_mib must be in"},
        // Embedding tables (dlrm) and the click log.
        Contradiction{"TablesWithAllreduceCheckpoints", "mode: ALLREDUCE model: \"dlrm\" checkpoint_dir: \"/tmp/c\"", "checkpoint_dir", "all-reduce checkpoints do not carry --model=dlrm's tables yet", "all-reduce checkpoints do not carry model dlrm's tables yet"},
        Contradiction{"TablesWithAllreduceOverlap", "mode: ALLREDUCE model: \"dlrm\" overlap: true", "overlap", "--overlap applies to the dense models, not --model=dlrm", "overlap applies to the dense models"},
        Contradiction{"TablesWithCodec", "mode: BSP model: \"dlrm\" compress: \"fp16\"", "compress", "--compress applies to the dense models, not --model=dlrm", "compress applies"},
        Contradiction{"TableDimOutsideDlrm", "table_dim: 8", "table_dim", "--table-dim applies to --model=dlrm", "table_dim applies"},
        Contradiction{"BadTableOptimizer", "model: \"dlrm\" table_optimizer: \"lamb\"", "table_optimizer", "--table-optimizer must be sgd, adagrad or adam", "table_optimizer must be"},
        Contradiction{"DlrmOnFashionMnist", "model: \"dlrm\" dataset: \"fashion-mnist\"", "dataset", "--model=dlrm cannot train on --dataset=fashion-mnist", "cannot train on"},
        Contradiction{"NoDenseClickFeatures", "model: \"dlrm\" click_dense: 0", "click_dense", "--click-dense must be in [1, 1024]", "click_dense must be in"},
        Contradiction{"BucketOutsideAllreduce", "mode: BSP bucket_mib: 4", "bucket_mib", "--bucket-mib applies to --mode=allreduce only", "bucket_mib applies to mode ALLREDUCE only"},
        Contradiction{"RingEncryptOutsideAllreduce", "mode: BSP ring_encrypt: true", "ring_encrypt", "--ring-encrypt applies to --mode=allreduce only", "ring_encrypt applies to mode ALLREDUCE only"},
        // The device.
        Contradiction{"UnknownDevice", "device: \"tpu\"", "device", "--device must be cpu or cuda, not 'tpu'", "device must be cpu or cuda"},
        Contradiction{"GpuOnCpu", "gpu: 1", "gpu", "--gpu applies to --device=cuda", "gpu applies to device cuda"},
        Contradiction{"SparseOnCuda", "device: \"cuda\" model: \"sparse_logreg\"", "device", "--device=cuda applies to --model=softmax|mlp", "device cuda applies to model softmax|mlp"},
        Contradiction{"AccumulateOnCuda", "device: \"cuda\" accumulate: 2", "accumulate", "--accumulate is not supported with --device=cuda", "accumulate is not supported"},
        // All-reduce buckets and checkpoints.
        Contradiction{"ZeroBucket", "mode: ALLREDUCE bucket_mib: 0", "bucket_mib", "--bucket-mib must be > 0", "bucket_mib must be > 0"},
        Contradiction{"ResumeWithoutDir", "mode: ALLREDUCE resume: true", "resume", "--resume and --checkpoint-every need --checkpoint-dir", "resume and checkpoint_every need checkpoint_dir"},
        Contradiction{"ZeroCollectiveTimeout", "mode: ALLREDUCE collective_timeout: 0", "collective_timeout", "--collective-timeout must be > 0", "collective_timeout must be > 0"},
        // Compression.
        Contradiction{"UnknownCodec", "mode: BSP compress: \"gzip\"", "compress", "--compress: unknown compression 'gzip'", "compress: unknown compression"},
        Contradiction{"FeedbackWithoutCodec", "mode: BSP error_feedback: true", "error_feedback", "--error-feedback needs a --compress codec", "error_feedback needs a compress codec"},
        Contradiction{"CodecOnSparseModel", "mode: BSP model: \"sparse_logreg\" dataset: \"sparse-logistic\" compress: \"fp16\"", "compress", "--compress applies to the dense models, not --model=sparse_logreg", "compress applies to the dense models"},
        Contradiction{"CodecLocal", "compress: \"fp16\"", "compress", "--compress applies to the modes that join a job", "compress applies to the modes"},
        Contradiction{"PullInAllreduce", "mode: ALLREDUCE compress: \"fp16\" compress_pull: true", "compress_pull", "all-reduce has no pulls", "compress_pull applies to the PS modes"},
        Contradiction{"CorrectionWithoutSparsifier", "mode: BSP compress: \"fp16\" momentum_correction: true", "momentum_correction", "--momentum-correction needs --compress=topk:R", "momentum_correction needs compress topk:R"},
        Contradiction{"CorrectionWithFeedback", "mode: BSP compress: \"topk:0.01\" momentum_correction: true error_feedback: true", "momentum_correction", "contradict each other", "contradict each other"},
        Contradiction{"CorrectionWithNesterov", "mode: BSP compress: \"topk:0.01\" momentum_correction: true nesterov: true", "momentum_correction", "does not combine with --nesterov", "does not combine with nesterov"},
        // The model and the data.
        Contradiction{"UnknownModel", "model: \"resnet\"", "model", "unknown model 'resnet'", "unknown model 'resnet'"},
        Contradiction{"BadHidden", "hidden: \"256,x\"", "hidden", "--hidden: '256,x' is not a comma-separated list", "hidden: '256,x'"},
        Contradiction{"HiddenForSoftmax", "model: \"softmax\" hidden: \"10\"", "hidden", "--hidden applies to --model=mlp only", "hidden applies to model mlp only"},
        Contradiction{"UnknownDataset", "dataset: \"cifar\"", "dataset", "unknown dataset 'cifar'", "unknown dataset 'cifar'"},
        Contradiction{"SparseModelOnDenseData", "model: \"sparse_logreg\" dataset: \"fashion-mnist\"", "dataset", "--model=sparse_logreg cannot train on --dataset=fashion-mnist", "model sparse_logreg cannot train on dataset fashion-mnist"},
        Contradiction{"DenseModelOnSparseData", "model: \"mlp\" dataset: \"sparse-logistic\"", "dataset", "cannot train on", "cannot train on"},
        Contradiction{"FeatureBits", "model: \"sparse_logreg\" feature_bits: 40", "feature_bits", "--feature-bits must be in [4, 30]", "feature_bits must be in"},
        // The optimizer and its schedule.
        Contradiction{"MomentumOutOfRange", "momentum: 1.5", "momentum", "--momentum must be in [0, 1), not 1.5", "momentum must be in [0, 1)"},
        Contradiction{"NegativeWeightDecay", "weight_decay: -1", "weight_decay", "--weight-decay must be >= 0", "weight_decay must be >= 0"},
        Contradiction{"NesterovWithoutMomentum", "nesterov: true momentum: 0", "nesterov", "--nesterov needs --momentum > 0", "nesterov needs momentum > 0"},
        Contradiction{"UnknownOptimizer", "optimizer: \"adagrad\"", "optimizer", "--optimizer must be sgd, adam, lars or lamb, not 'adagrad'", "optimizer must be sgd, adam, lars or lamb"},
        Contradiction{"AdamWithMomentum", "optimizer: \"adam\" momentum: 0.9", "momentum", "--momentum is SGD's: --optimizer=adam has --adam-beta1", "momentum is SGD's: optimizer adam has adam_beta1"},
        Contradiction{"AdamWithNesterov", "optimizer: \"adam\" nesterov: true", "nesterov", "--nesterov is SGD's, not --optimizer=adam's", "nesterov is SGD's"},
        Contradiction{"AdamWithCorrection", "mode: BSP optimizer: \"adam\" compress: \"topk:0.01\" momentum_correction: true", "momentum_correction", "--momentum-correction applies to --optimizer=sgd", "momentum_correction applies to optimizer sgd"},
        Contradiction{"LambWithMomentum", "optimizer: \"lamb\" momentum: 0.9", "momentum", "--momentum is SGD's and LARS's: --optimizer=lamb has --adam-beta1", "momentum is SGD's and LARS's: optimizer lamb has adam_beta1"},
        Contradiction{"LarsWithNesterov", "optimizer: \"lars\" nesterov: true", "nesterov", "--nesterov is SGD's, not --optimizer=lars's", "nesterov is SGD's, not optimizer lars's"},
        Contradiction{"LambWithNesterov", "optimizer: \"lamb\" momentum: 0 nesterov: true", "nesterov", "--nesterov is SGD's, not --optimizer=lamb's", "nesterov is SGD's"},
        Contradiction{"LarsWithCorrection", "mode: BSP optimizer: \"lars\" compress: \"topk:0.01\" momentum_correction: true", "momentum_correction", "--momentum-correction applies to --optimizer=sgd", "momentum_correction applies to optimizer sgd"},
        Contradiction{"LarsOnSparseModel", "optimizer: \"lars\" model: \"sparse_logreg\"", "optimizer", "--optimizer=lars applies to the dense models, not --model=sparse_logreg", "optimizer lars applies to the dense models"},
        Contradiction{"LambOnSparseModel", "mode: BSP optimizer: \"lamb\" model: \"sparse_logreg\"", "optimizer", "--optimizer=lamb applies to the dense models, not --model=sparse_logreg", "optimizer lamb applies to the dense models"},
        Contradiction{"LarsOnTheDeviceLocally", "optimizer: \"lars\" device: \"cuda\"", "optimizer", "--optimizer=lars with --device=cuda runs in the PS modes only", "optimizer lars with device cuda runs in the PS modes only"},
        Contradiction{"TrustCoefficientWithSgd", "trust_coefficient: 0.01", "trust_coefficient", "--trust-coefficient applies to --optimizer=lars", "trust_coefficient applies to optimizer lars"},
        Contradiction{"TrustCoefficientWithLamb", "optimizer: \"lamb\" trust_coefficient: 0.01", "trust_coefficient", "--trust-coefficient applies to --optimizer=lars", "trust_coefficient applies to optimizer lars"},
        Contradiction{"ZeroTrustCoefficient", "optimizer: \"lars\" trust_coefficient: 0", "trust_coefficient", "--trust-coefficient must be > 0, not 0", "trust_coefficient must be > 0"},
        Contradiction{"LambBeta", "optimizer: \"lamb\" adam_beta2: 1", "adam_beta2", "--adam-beta2 must be in [0, 1), not 1", "adam_beta2 must be in [0, 1)"},
        Contradiction{"LambEps", "optimizer: \"lamb\" adam_eps: 0", "adam_eps", "--adam-eps must be > 0", "adam_eps must be > 0"},
        Contradiction{"EpsWithLars", "optimizer: \"lars\" adam_eps: 1e-6", "adam_eps", "--adam-eps applies to --optimizer=adam and --optimizer=lamb", "adam_eps applies to optimizer adam and optimizer lamb"},
        Contradiction{"AdamOnSparseModel", "optimizer: \"adam\" model: \"sparse_logreg\"", "optimizer", "--optimizer=adam applies to the dense models, not --model=sparse_logreg", "optimizer adam applies to the dense models"},
        Contradiction{"AdamOnTheDeviceLocally", "optimizer: \"adam\" device: \"cuda\"", "optimizer", "--optimizer=adam with --device=cuda runs in the PS modes only", "optimizer adam with device cuda"},
        Contradiction{"AdamBeta", "optimizer: \"adam\" adam_beta2: 1", "adam_beta2", "--adam-beta2 must be in [0, 1), not 1", "adam_beta2 must be in [0, 1)"},
        Contradiction{"AdamEps", "optimizer: \"adam\" adam_eps: 0", "adam_eps", "--adam-eps must be > 0", "adam_eps must be > 0"},
        Contradiction{"BetaWithSgd", "adam_beta1: 0.8", "adam_beta1", "--adam-beta1 applies to --optimizer=adam", "adam_beta1 applies to optimizer adam"},
        // Precision.
        Contradiction{"UnknownPrecision", "precision: \"fp8\"", "precision", "--precision must be fp32, bf16 or fp16, not 'fp8'", "precision must be fp32, bf16 or fp16"},
        Contradiction{"PrecisionOnSparseModel", "precision: \"bf16\" model: \"sparse_logreg\"", "precision", "--precision=bf16 applies to the dense models, not --model=sparse_logreg", "precision bf16 applies to the dense models"},
        Contradiction{"LossScaleWithoutFp16", "precision: \"bf16\" initial_loss_scale: 1024", "initial_loss_scale", "--initial-loss-scale applies to --precision=fp16", "initial_loss_scale applies to precision fp16"},
        Contradiction{"LossScaleBelowOne", "precision: \"fp16\" initial_loss_scale: 0.5", "initial_loss_scale", "--initial-loss-scale must be a finite number >= 1, not 0.5", "initial_loss_scale must be a finite number >= 1"},
        Contradiction{"Fp16WithErrorFeedback", "mode: ALLREDUCE precision: \"fp16\" compress: \"topk:0.01\" error_feedback: true", "error_feedback", "--precision=fp16 skips the steps whose scaled gradient overflows", "precision fp16 skips the steps"},
        Contradiction{"NegativeLr", "lr: -1", "lr", "--lr must be > 0", "lr must be > 0"},
        Contradiction{"UnknownSchedule", "lr_schedule: \"step\"", "lr_schedule", "constant, cosine or linear", "constant, cosine or linear"},
        Contradiction{"ZeroBatch", "batch: 0", "batch", "--batch must be in [1, 1000000]", "batch must be in"},
        Contradiction{"ZeroAccumulate", "accumulate: 0", "accumulate", "--accumulate must be in [1, 4096]", "accumulate must be in"},
        Contradiction{"AccumulateSparse", "model: \"sparse_logreg\" accumulate: 2", "accumulate", "--accumulate applies to the dense models", "accumulate applies"},
        Contradiction{"UnknownLrScaling", "lr_scaling: \"sqrt\"", "lr_scaling", "--lr-scaling must be none or linear", "lr_scaling must be none or linear"},
        Contradiction{"BaseBatchWithoutScaling", "base_batch: 32", "base_batch", "--base-batch applies to --lr-scaling=linear", "base_batch applies to lr_scaling linear"},
        Contradiction{"StalenessAwareInBsp", "mode: BSP staleness_aware_lr: true", "staleness_aware_lr", "--staleness-aware-lr applies to --mode=ssp|asp", "staleness_aware_lr applies to mode SSP|ASP"},
        Contradiction{"NegativeWarmup", "warmup_epochs: -1", "warmup_epochs", "--warmup-epochs must be in [0, 1000]", "warmup_epochs must be in"},
        Contradiction{"ZeroEpochs", "epochs: 0", "epochs", "--epochs must be in [1, 1000000]", "epochs must be in"},
        Contradiction{"NegativeMaxSteps", "max_steps: -1", "max_steps", "--max-steps must be >= 0", "max_steps must be >= 0"},
        Contradiction{"NegativeEvalEvery", "eval_every: -1", "eval_every", "--eval-every must be >= 0", "eval_every must be >= 0"},
        Contradiction{"BadStraggle", "straggle: \"slow\"", "straggle", "--straggle: straggler 'slow'", "straggle: straggler 'slow'"},
        Contradiction{"ZeroThreads", "threads: 0", "threads", "--threads must be in [1, 256]", "threads must be in"},
        Contradiction{"ZeroRequestTimeout", "mode: BSP request_timeout: 0", "request_timeout", "--request-timeout must be > 0", "request_timeout must be > 0"},
        Contradiction{"RoundsAlone", "sync_every: 4", "sync_every", "--sync-every applies to --mode=bsp|ssp|asp|allreduce", "sync_every applies to mode BSP|SSP|ASP|ALLREDUCE"},
        Contradiction{"NegativeRounds", "mode: BSP sync_every: -1", "sync_every", "--sync-every must be in [0, 1000000]", "sync_every must be in"},
        Contradiction{"OuterWithoutRounds", "mode: BSP outer_lr: 0.7", "outer_lr", "--outer-lr applies to --sync-every > 0", "outer_lr applies to sync_every > 0"},
        Contradiction{"ZeroOuterLr", "mode: BSP sync_every: 4 outer_lr: 0", "outer_lr", "--outer-lr must be > 0, not 0", "outer_lr must be > 0"},
        Contradiction{"OuterMomentumOne", "mode: BSP sync_every: 4 outer_momentum: 1", "outer_momentum", "--outer-momentum must be in [0, 1), not 1", "outer_momentum must be in"},
        Contradiction{"OuterNesterovWithoutMomentum", "mode: BSP sync_every: 4 outer_nesterov: true", "outer_nesterov", "--outer-nesterov needs --outer-momentum > 0", "outer_nesterov needs outer_momentum > 0"},
        Contradiction{"RoundsSparse", "mode: BSP sync_every: 4 model: \"sparse_logreg\"", "sync_every", "--sync-every applies to the dense models", "sync_every applies to the dense models"},
        Contradiction{"PowerSgdOverThePs", "mode: BSP compress: \"powersgd:4\"", "compress", "--compress=powersgd:4 applies to --mode=allreduce", "compress powersgd:4 applies to mode ALLREDUCE"},
        Contradiction{"CompensationInBsp", "mode: BSP delay_compensation: 0.5", "delay_compensation", "--delay-compensation applies to --mode=ssp|asp", "delay_compensation applies to mode SSP|ASP"},
        Contradiction{"NegativeCompensation", "mode: ASP delay_compensation: -1", "delay_compensation", "--delay-compensation must be >= 0, not -1", "delay_compensation must be >= 0"},
        Contradiction{"AdaptiveAlone", "mode: ASP delay_compensation_adaptive: true", "delay_compensation_adaptive", "--delay-compensation-adaptive needs --delay-compensation", "delay_compensation_adaptive needs delay_compensation"},
        Contradiction{"CompensationCompressedPull", "mode: ASP delay_compensation: 0.5 compress: \"topk:0.1\" compress_pull: true", "compress_pull", "--compress-pull does not combine with --delay-compensation", "compress_pull does not combine with delay_compensation"},
        Contradiction{"RoundsCompressedPull", "mode: BSP sync_every: 4 compress: \"topk:0.1\" compress_pull: true", "compress_pull", "--compress-pull does not combine with --sync-every", "compress_pull does not combine with sync_every"}),
    [](const ::testing::TestParamInfo<Contradiction>& p) { return p.param.name; });

TEST(TrainConfigTest, ReportsEveryContradiction) {
  auto errors = Validate(Config("model: \"mlp\" dataset: \"sparse-logistic\" lr: 0 batch: 0 compress: \"fp16\""));
  ASSERT_EQ(errors.size(), 4u) << JoinErrors(errors);
  EXPECT_EQ(errors[0].field, "compress");
  EXPECT_EQ(errors[1].field, "dataset");
  EXPECT_EQ(errors[2].field, "lr");
  EXPECT_EQ(errors[3].field, "batch");
  EXPECT_EQ(JoinErrors(errors).find('\n'), std::string::npos);
}

TEST(TrainConfigTest, ProcessSettings) {
  config::WorkerProcess p;
  auto first = [](const std::vector<ConfigError>& e) { return e.empty() ? std::string() : e[0].message; };
  EXPECT_NE(first(Validate(Config("mode: BSP"), p)).find("--mode=bsp needs --scheduler=HOST:PORT"), std::string::npos);
  p.set_scheduler("localhost");
  EXPECT_NE(first(Validate(Config("mode: BSP"), p)).find("--scheduler: 'localhost' is not HOST:PORT"), std::string::npos);
  EXPECT_NE(first(Validate(Config(""), p)).find("--scheduler applies to the modes that join a job only"), std::string::npos);
  p.set_scheduler("127.0.0.1:9");
  p.set_heartbeat_interval(20);
  EXPECT_NE(first(Validate(Config("mode: ASP"), p)).find("--heartbeat-interval must be > 0 and below --heartbeat-timeout"), std::string::npos);
  p.clear_heartbeat_interval();
  p.set_bind("0.0.0.0");
  EXPECT_NE(first(Validate(Config("mode: ASP"), p)).find("--bind applies to --mode=allreduce only"), std::string::npos);
  EXPECT_TRUE(Validate(Config("mode: ALLREDUCE"), p).empty());
  // The ring's keys come from --auth-dir.
  EXPECT_NE(first(Validate(Config("mode: ALLREDUCE ring_encrypt: true"), p)).find("--ring-encrypt needs --auth-dir"),
            std::string::npos);
  p.set_auth_dir("/keys");
  EXPECT_TRUE(Validate(Config("mode: ALLREDUCE ring_encrypt: true"), p).empty());
}

TEST(TrainConfigTest, ModeNameTable) {
  for (config::Mode m : {config::LOCAL, config::BSP, config::SSP, config::ASP, config::ALLREDUCE}) {
    auto parsed = ParseMode(ModeName(m));
    ASSERT_TRUE(parsed.ok()) << ModeName(m);
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_EQ(ModeName(config::SSP), "ssp");
  EXPECT_FALSE(ParseMode("SSP").ok());
  EXPECT_FALSE(ParseMode("sync").ok());
  EXPECT_TRUE(IsPsMode(config::ASP));
  EXPECT_FALSE(IsPsMode(config::ALLREDUCE));
  EXPECT_TRUE(JoinsJob(config::ALLREDUCE));
  EXPECT_FALSE(JoinsJob(config::LOCAL));
}

// gradsync-worker's flags (no environment) -> TrainConfig and WorkerProcess.
Status ParseFlags(const std::vector<std::string>& args, config::TrainConfig* train, config::WorkerProcess* process) {
  FlagParser parser("prog", "test");
  AddWorkerFlags(parser.options());
  std::vector<const char*> argv = {"prog"};
  for (const auto& s : args) argv.push_back(s.c_str());
  const char* env[] = {nullptr};
  auto vm = parser.ParseOrExit(static_cast<int>(argv.size()), argv.data(), env);
  return FlagsToConfig(vm, train, process);
}

// flags -> TrainConfig -> flags -> TrainConfig: the same config, the same flags.
TEST(TrainFlagsTest, RoundTrip) {
  const std::vector<std::string> args = {
      "--mode=ssp", "--staleness=3", "--model=mlp", "--hidden=64,32", "--dataset=blobs", "--data-dir=/d",
      "--standardize=false", "--feature-bits=12", "--lr=0.05", "--lr-schedule=constant", "--momentum=0.8",
      "--nesterov", "--weight-decay=0.001", "--epochs=3", "--batch=16", "--max-steps=100", "--seed=7",
      "--accumulate=2", "--lr-scaling=linear", "--base-batch=32", "--warmup-epochs=0.5", "--staleness-aware-lr",
      "--compress=topk:0.01", "--error-feedback", "--compress-pull", "--overlap=false", "--push-part-mib=0.25",
      "--busy-poll-ms=2.5", "--device=cpu", "--request-timeout=30", "--recovery-timeout=0", "--straggle=uniform:1:5",
      "--straggle-seed=9", "--threads=2", "--log-every=10", "--eval-every=20"};
  config::TrainConfig a, b;
  config::WorkerProcess pa, pb;
  ASSERT_TRUE(ParseFlags(args, &a, &pa).ok());
  EXPECT_TRUE(Validate(a).empty()) << JoinErrors(Validate(a));
  EXPECT_EQ(a.mode(), config::SSP);
  EXPECT_FLOAT_EQ(a.lr(), 0.05f);
  EXPECT_TRUE(a.nesterov());
  EXPECT_FALSE(a.has_resume());  // a default is not "given"
  const std::vector<std::string> flags = ConfigToFlags(a);
  EXPECT_EQ(flags, args);  // every flag given, in the table's order, spelled the same
  ASSERT_TRUE(ParseFlags(flags, &b, &pb).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(a, b)) << a.DebugString() << "\nvs\n" << b.DebugString();
  EXPECT_EQ(ConfigToFlags(b), flags);
  // Nothing given: nothing set, no flags.
  config::TrainConfig none;
  ASSERT_TRUE(ParseFlags({}, &none, &pa).ok());
  EXPECT_EQ(none.ByteSizeLong(), 0u);
  EXPECT_TRUE(ConfigToFlags(none).empty());
  EXPECT_EQ(ConfigToFlags(a, {"mode", "staleness"}).front(), "--model=mlp");
}

TEST(TrainFlagsTest, AdamsFlagsRoundTrip) {
  const std::vector<std::string> args = {"--optimizer=adam", "--momentum=0", "--weight-decay=0.01", "--adam-beta1=0.8",
                                         "--adam-beta2=0.99", "--adam-eps=1e-06"};
  config::TrainConfig c;
  config::WorkerProcess p;
  ASSERT_TRUE(ParseFlags(args, &c, &p).ok());
  EXPECT_TRUE(Validate(c).empty()) << JoinErrors(Validate(c));
  EXPECT_EQ(c.optimizer(), "adam");
  EXPECT_EQ(c.adam_beta1(), 0.8);
  EXPECT_EQ(c.adam_eps(), 1e-6);
  EXPECT_EQ(ConfigToFlags(c), args);
}

TEST(TrainFlagsTest, EveryFieldHasAFlag) {
  std::set<std::string> flagged;
  for (const WorkerFlag& f : WorkerFlags()) flagged.insert((f.process ? "p." : "t.") + std::string(f.flag));
  for (const auto* d : {config::TrainConfig::descriptor(), config::WorkerProcess::descriptor()}) {
    for (int i = 0; i < d->field_count(); ++i) {
      std::string flag = d->field(i)->name();
      std::replace(flag.begin(), flag.end(), '_', '-');
      EXPECT_TRUE(flagged.count((d == config::TrainConfig::descriptor() ? "t." : "p.") + flag)) << d->field(i)->name();
    }
  }
  EXPECT_EQ(flagged.size(), static_cast<size_t>(config::TrainConfig::descriptor()->field_count() +
                                                config::WorkerProcess::descriptor()->field_count()));
}

TEST(JobFingerprintTest, HoldsTheSettingsThatMustAgree) {
  const config::TrainConfig base = Config("mode: BSP");
  const std::string fp = JobFingerprint(base);
  EXPECT_EQ(JobFingerprint(base), fp);  // deterministic
  // A default given explicitly is the same setting.
  EXPECT_EQ(JobFingerprint(Config("mode: BSP lr: 0.02 batch: 64 model: \"mlp\" dataset: \"fashion-mnist\"")), fp);
  // Per-process settings may differ.
  for (const char* same : {"mode: BSP threads: 4", "mode: BSP data_dir: \"/x\"", "mode: BSP straggle: \"x:3\" straggle_seed: 2",
                           "mode: BSP eval_every: 10 log_every: 5", "mode: BSP overlap: false push_part_mib: 1",
                           "mode: BSP request_timeout: 5 recovery_timeout: 0", "mode: BSP device: \"cuda\" gpu: 1",
                           "mode: SSP staleness: 3"}) {
    EXPECT_EQ(JobFingerprint(Config(same)), fp) << same;
  }
  // Training settings may not.
  for (const char* other : {"mode: BSP lr: 0.05", "mode: BSP batch: 32", "mode: BSP hidden: \"64\"", "mode: BSP seed: 1",
                            "mode: BSP compress: \"fp16\"", "mode: BSP accumulate: 2", "mode: BSP feature_bits: 12",
                            "mode: BSP dataset: \"blobs\"", "mode: BSP epochs: 3", "mode: BSP momentum: 0.5",
                            "mode: BSP optimizer: \"adam\"", "mode: BSP model: \"dlrm\" table_dim: 32",
                            "mode: BSP model: \"dlrm\" table_optimizer: \"adam\"", "mode: BSP model: \"dlrm\" click_ids: 1000"}) {
    EXPECT_NE(JobFingerprint(Config(other)), fp) << other;
  }
  // Adam: SGD's default momentum unused (the same as 0); its own settings count.
  const std::string adam = JobFingerprint(Config("mode: BSP optimizer: \"adam\""));
  EXPECT_EQ(JobFingerprint(Config("mode: BSP optimizer: \"adam\" momentum: 0 adam_beta1: 0.9")), adam);
  EXPECT_NE(JobFingerprint(Config("mode: BSP optimizer: \"adam\" adam_beta2: 0.99")), adam);
  EXPECT_EQ(JobFingerprint(Config("mode: BSP optimizer: \"sgd\"")), fp);
  // lars: momentum and the trust coefficient count, the betas do not; lamb: the betas count,
  // momentum and the trust coefficient do not.
  const std::string lars = JobFingerprint(Config("mode: BSP optimizer: \"lars\""));
  EXPECT_NE(lars, fp);
  EXPECT_EQ(JobFingerprint(Config("mode: BSP optimizer: \"lars\" trust_coefficient: 0.001 momentum: 0.9")), lars);
  EXPECT_NE(JobFingerprint(Config("mode: BSP optimizer: \"lars\" trust_coefficient: 0.02")), lars);
  EXPECT_NE(JobFingerprint(Config("mode: BSP optimizer: \"lars\" momentum: 0.5")), lars);
  const std::string lamb = JobFingerprint(Config("mode: BSP optimizer: \"lamb\""));
  EXPECT_NE(lamb, adam);
  EXPECT_EQ(JobFingerprint(Config("mode: BSP optimizer: \"lamb\" momentum: 0 adam_eps: 1e-8")), lamb);
  EXPECT_NE(JobFingerprint(Config("mode: BSP optimizer: \"lamb\" adam_eps: 1e-6")), lamb);
  EXPECT_EQ(JobFingerprint(Config("mode: BSP trust_coefficient: 0.5")), fp);  // sgd has none
  // Every rank of a ring alike: the device and the buckets count there.
  const std::string ar = JobFingerprint(Config("mode: ALLREDUCE"));
  EXPECT_NE(JobFingerprint(Config("mode: ALLREDUCE bucket_mib: 4")), ar);
  EXPECT_NE(JobFingerprint(Config("mode: ALLREDUCE device: \"cuda\"")), ar);
  EXPECT_NE(JobFingerprint(Config("mode: ALLREDUCE resume: true checkpoint_dir: \"/c\"")), ar);
  EXPECT_EQ(JobFingerprint(Config("mode: ALLREDUCE checkpoint_dir: \"/c\" checkpoint_every: 5")), ar);
}

TEST(JobFingerprintTest, DifferenceNamesTheSettings) {
  auto d = DescribeFingerprintDifference(JobFingerprint(Config("mode: BSP lr: 0.05 batch: 32")),
                                         JobFingerprint(Config("mode: BSP")));
  EXPECT_EQ(d.mine, "--lr=0.05 --batch=32");
  EXPECT_EQ(d.theirs, "--lr=0.02 --batch=64");
  auto junk = DescribeFingerprintDifference("\xff\xff\xff", JobFingerprint(Config("")));
  EXPECT_NE(junk.mine.find("3 bytes"), std::string::npos);
}

TEST(TrainConfigTest, ShortestText) {
  EXPECT_EQ(ShortestText(0.02f), "0.02");
  EXPECT_EQ(ShortestText(0.9f), "0.9");
  EXPECT_EQ(ShortestText(25.0), "25");
  EXPECT_EQ(ShortestText(0.1), "0.1");
}

TEST(TrainConfigTest, CodecAndStragglerSyntax) {
  EXPECT_TRUE(ParseCodecSpec("topk:0.01")->sparse());
  EXPECT_FALSE(ParseCodecSpec("qsgd:16")->sparse());
  EXPECT_EQ(ParseCodecSpec("none")->kind, CodecSpec::Kind::kNone);
  EXPECT_TRUE(ParseCodecSpec("powersgd:4")->low_rank());
  EXPECT_EQ(ParseCodecSpec("powersgd:4")->param, 4);
  for (const char* bad : {"fp16:2", "qsgd:0", "topk:2", "randomk:", "gzip", "", "powersgd:0", "powersgd:1.5", "powersgd"}) {
    EXPECT_FALSE(ParseCodecSpec(bad).ok()) << bad;
  }
  EXPECT_EQ(ParseStraggler("x:3")->kind, StragglerSpec::Kind::kMultiple);
  EXPECT_FALSE(ParseStraggler("x:0.5").ok());
}

}  // namespace
}  // namespace gradsync

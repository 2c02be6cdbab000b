#include "server/server.h"

namespace gradsync {

Result<std::unique_ptr<Server>> Server::Create(TransportContext& ctx, const ServerOptions& options) {
  ASSIGN_OR_RETURN(Socket s, Socket::BindRouter(ctx, options.channels.bind_host, options.channels.port));
  return std::unique_ptr<Server>(new Server(ctx, options, std::move(s)));
}

Server::Server(TransportContext& ctx, ServerOptions options, Socket socket)
    : options_(std::move(options)),
      socket_(std::move(socket)),
      registration_(ctx, options_, socket_, stats_.requests),
      replies_(socket_, registration_, stats_.requests),
      checkpoints_(options_.checkpoints, shard_, registration_, stats_.recovery),
      state_(socket_, shard_, registration_, checkpoints_, replies_, stats_.state),
      push_pull_(ctx, options_.record_pulls, socket_, shard_, registration_, checkpoints_, state_, replies_,
                 stats_.requests),
      lifecycle_(ctx, options_, socket_, stop_, registration_, shard_, checkpoints_, push_pull_, stats_.recovery),
      dispatcher_(socket_, shard_, registration_, lifecycle_, push_pull_, state_, replies_, stats_.requests) {}

std::vector<float> Server::params() const {
  if (!shard_.built()) return {};
  return std::vector<float>(shard_.core->shard().params().begin(), shard_.core->shard().params().end());
}

std::vector<wire::TableRowsCheckpoint> Server::table_rows() const {
  if (!shard_.built()) return {};
  return shard_.core->shard().tables().Save();
}

std::pair<int64_t, uint64_t> Server::table_size() const {
  if (!shard_.built()) return {0, 0};
  return {shard_.core->shard().tables().rows(), shard_.core->shard().tables().bytes()};
}

Status Server::Run() {
  RETURN_IF_ERROR(lifecycle_.Start());
  Status result;
  while (!stop_.load()) {
    dispatcher_.Receive();
    if (auto end = lifecycle_.Poll()) {
      result = *end;
      break;
    }
  }
  Finish();
  lifecycle_.Finish();
  return result;
}

void Server::Finish() {
  stats_.traffic = socket_.traffic();
  stats_.traffic.bytes_sent += shard_.channels->bytes_sent();  // the data channels' bytes are on the wire too
  stats_.traffic.bytes_received += shard_.channels->bytes_received();
  stats_.channels = shard_.channels->counts();
  stats_.replication.replicated = shard_.replication->counts().sent;
  stats_.replication.replica_entries = shard_.replication->counts().received;
}

}  // namespace gradsync

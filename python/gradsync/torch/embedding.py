"""gradsync.torch.Embedding and EmbeddingBag: drop-ins for nn.Embedding / nn.EmbeddingBag whose
table never lives in this process (ARCHITECTURE.md, "Tables").

    emb = gs.EmbeddingBag(2**30, 32, mode="sum")      # 128 GiB if it were dense: it is not
    opt = gs.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), ...)
    loss = model(batch); loss.backward(); opt.step()  # as with nn.EmbeddingBag(sparse=True)

A table is rows of 64-bit ids, created on first touch with a seeded rule (normal:1, as
nn.Embedding initializes, unless `init` says otherwise), so every process agrees on a row
without any broadcast. Where the rows live is the job's mode: on the PS shards (bsp / ssp / asp:
a forward pulls its batch's unique ids, the step's push carries their gradients summed per id),
in every worker's replica kept equal by an all-gather of each step's ids and row gradients
(allreduce), or in this process (local). Either way the process holds the rows of its batches,
never the table. The rows' optimizer is applied where they live: `optimizer` ("sgd", row-wise
"adagrad", lazy "adam"), by default the wrapped optimizer's kind (torch.optim.SGD -> sgd, Adam /
AdamW / SparseAdam -> adam with its betas and eps, Adagrad -> row-wise adagrad with its eps and
initial accumulator) at the optimizer's learning rate of each step; SGD's momentum and weight
decay do not apply to rows.

The tables bind to the first DistributedOptimizer built after them (every table made before it, in
the order they were made, named "embedding0", "embedding1", ... unless `name` is given); a forward
before that raises. state_dict() holds a ShardedWeight in place of the weight: it reads rows on
demand (`sd["emb.weight"][ids]`) and pickles as its description alone, and broadcast_parameters
skips it (nothing is materialized or moved).
"""

import weakref

import numpy as np
import torch
import torch.nn.functional as F

from gradsync import _native

_UNBOUND = []  # weak references to the tables made and not yet bound to an optimizer, in order
_MADE = [0]  # tables made in this process: the default names


def _begin_step(opt_ref, training):
    """A training forward (the module training, gradients enabled) reads rows at its step's clock,
    as its parameters are read: the optimizer's step begins first. Returns whether it trains."""
    train = training and torch.is_grad_enabled()
    opt = opt_ref() if train else None
    if opt is not None and not opt._gs_begun and not opt._gs_finished:
        opt._gs_begin()
    return train


class ShardedWeight:
    """A table's weight in a state_dict: `w[ids]` (ids a sequence or tensor of ints) reads those
    rows as they are now (a float32 tensor [len(ids), dim]); shape, num_embeddings and embedding_dim
    describe it. Pickled (torch.save), it keeps the description and none of the rows: the rows'
    checkpoint is the shards' (gradsync-server --checkpoint-dir)."""

    def __init__(self, table):
        self._table = table
        self.name = table.table_name
        self.num_embeddings = table.num_embeddings
        self.embedding_dim = table.embedding_dim

    @property
    def shape(self):
        return torch.Size([self.num_embeddings, self.embedding_dim])

    def __getitem__(self, ids):
        if self._table is None:
            raise ValueError("table '%s': a loaded ShardedWeight has no rows (they live on the shards)" % self.name)
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        with torch.no_grad():
            return self._table.lookup(ids)

    def __getstate__(self):
        return {"name": self.name, "num_embeddings": self.num_embeddings, "embedding_dim": self.embedding_dim,
                "_table": None}

    def __repr__(self):
        return "ShardedWeight(%r, %d x %d)" % (self.name, self.num_embeddings, self.embedding_dim)


class _Table(torch.nn.Module):
    """What Embedding and EmbeddingBag share: the table's description, its binding to the
    optimizer's sync, the step's lookups (the rows each forward read, leaves of autograd), and the
    rows' gradients handed to the sync when the step ends (hand_over)."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, name=None, init="normal:1", optimizer=None,
                 seed=None, max_rows_per_shard=1 << 24):
        super().__init__()
        if num_embeddings is None:
            num_embeddings = 0
        if int(num_embeddings) < 0 or int(num_embeddings) >= 2**63:
            raise ValueError("num_embeddings must be in [0, 2^63) (0: any 64-bit id), got %r" % num_embeddings)
        if int(embedding_dim) < 1:
            raise ValueError("embedding_dim must be >= 1, got %r" % embedding_dim)
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        if padding_idx is not None:
            if padding_idx < 0:
                padding_idx += self.num_embeddings
            if not 0 <= padding_idx < max(1, self.num_embeddings):
                raise ValueError("padding_idx must be within num_embeddings")
        self.padding_idx = padding_idx
        self.table_name = name if name is not None else "embedding%d" % _MADE[0]
        _MADE[0] += 1
        self.init = init
        self.row_optimizer = optimizer
        self.seed = seed
        self.max_rows_per_shard = int(max_rows_per_shard)
        self._opt = None  # a weak reference to the DistributedOptimizer it is bound to
        self._sync = None  # that optimizer's native sync
        self._index = -1  # this table's index in the sync's tables
        self._lookups = []  # this step's (unique ids, rows leaf) per forward that needs a gradient
        _UNBOUND.append(weakref.ref(self))

    def extra_repr(self):
        return "%r, %d, %d" % (self.table_name, self.num_embeddings, self.embedding_dim)

    # --- binding (DistributedOptimizer) ---

    def spec(self, index, wrapped, job_seed):
        """The table as the sync declares it: row optimizer resolved against the wrapped optimizer."""
        s = _native.TableSpec()
        s.name = self.table_name
        s.dim = self.embedding_dim
        s.num_ids = self.num_embeddings
        s.init = self.init
        s.init_seed = int(self.seed) if self.seed is not None else (int(job_seed) * 1000003 + index) % 2**64
        s.max_rows_per_shard = self.max_rows_per_shard
        kind, options = _row_optimizer(self.row_optimizer, wrapped)
        s.optimizer = kind
        for k, v in options.items():
            setattr(s, k, v)
        return s

    def bind(self, opt, index):
        self._opt = weakref.ref(opt)
        self._sync = opt._gs_sync
        self._index = index

    # --- a forward ---

    def _ids(self, input):
        if input.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ValueError("table '%s': ids must be integers (got %s)" % (self.table_name, input.dtype))
        ids = input.reshape(-1).to(torch.int64)
        if ids.numel():
            low = int(ids.min())
            if low < 0:
                raise ValueError("table '%s': id %d is negative" % (self.table_name, low))
            high = int(ids.max())
            if self.num_embeddings and high >= self.num_embeddings:
                raise ValueError("table '%s': id %d is outside the table's %d ids"
                                 % (self.table_name, high, self.num_embeddings))
        return ids

    def lookup(self, ids):
        """The rows of `ids` (int64, any order, repeats allowed) as a [len(ids), dim] tensor,
        read where the table lives; in a training forward they are leaves whose gradient the step
        sends."""
        rows, inverse, padding = self._rows(ids)
        return F.embedding(inverse, rows, padding_idx=padding)

    def _rows(self, ids):
        """(rows [U (+1), dim], inverse [len(ids)], padding row or None): the unique ids' rows, and
        each id's row among them; the padding id's row is a zero row that no gradient leaves."""
        if self._sync is None:
            raise ValueError("table '%s': its rows live where the job keeps them; build the DistributedOptimizer "
                             "(after the model, as with any parameter) before the first forward" % self.table_name)
        train = _begin_step(self._opt, self.training)
        ids = self._ids(ids)
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        padding = None
        if self.padding_idx is not None:
            keep = unique != self.padding_idx
            if not bool(keep.all()):
                padding = int((~keep).nonzero()[0, 0])
        read = unique if padding is None else unique[unique != self.padding_idx]
        fetched = torch.from_numpy(self._sync.read_rows(self._index, read.numpy().astype(np.uint64)))
        if train:
            fetched.requires_grad_(True)
            self._lookups.append((read, fetched))
        if padding is None:
            return fetched, inverse, None
        rows = torch.zeros(unique.numel(), self.embedding_dim)
        rows[torch.arange(unique.numel()) != padding] = fetched
        return rows, inverse, padding

    # --- the step's end ---

    def hand_over(self):
        """The step's row gradients, summed per id over its forwards, to the sync; returns the
        rows handed (0 when no forward of the step needs a gradient)."""
        lookups, self._lookups = self._lookups, []
        with_grad = [(ids, rows.grad) for ids, rows in lookups if rows.grad is not None and ids.numel()]
        if not with_grad:
            return 0
        if len(with_grad) == 1:
            ids, grads = with_grad[0]
        else:
            every = torch.cat([ids for ids, _ in with_grad])
            ids, inverse = torch.unique(every, sorted=True, return_inverse=True)
            grads = torch.zeros(ids.numel(), self.embedding_dim)
            grads.index_add_(0, inverse, torch.cat([g for _, g in with_grad]))
        self._sync.set_row_grads(self._index, ids.numpy().astype(np.uint64), grads.contiguous().numpy())
        return int(ids.numel())

    def forget_step(self):
        self._lookups = []

    # --- state ---

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = ShardedWeight(self)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        w = state_dict.get(prefix + "weight")
        if w is not None:
            shape = tuple(w.shape)
            if shape != (self.num_embeddings, self.embedding_dim):
                error_msgs.append("table '%s': the state_dict's weight is %s, the table %s"
                                  % (self.table_name, shape, (self.num_embeddings, self.embedding_dim)))
            elif isinstance(w, torch.Tensor):
                error_msgs.append("table '%s': a dense weight cannot be loaded into a table that lives on the "
                                  "shards (restore the shards' checkpoint instead)" % self.table_name)
        own = {k: v for k, v in state_dict.items() if k != prefix + "weight"}
        super()._load_from_state_dict(own, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if prefix + "weight" in missing_keys:
            missing_keys.remove(prefix + "weight")


class Embedding(_Table):
    """nn.Embedding(num_embeddings, embedding_dim, padding_idx) whose rows live where the job keeps
    them (the module docstring). num_embeddings=0: any 64-bit id (hashed features)."""

    def forward(self, input):
        rows, inverse, padding = self._rows(input)
        return F.embedding(inverse.view(input.shape), rows, padding_idx=padding)


class EmbeddingBag(_Table):
    """nn.EmbeddingBag(num_embeddings, embedding_dim, mode="sum" | "mean", padding_idx): a bag's
    rows reduced; input 2-D [bags, ids] or 1-D with offsets; per_sample_weights with mode sum."""

    def __init__(self, num_embeddings, embedding_dim, mode="mean", padding_idx=None, include_last_offset=False,
                 **kwargs):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx, **kwargs)
        if mode not in ("sum", "mean"):
            raise ValueError("EmbeddingBag mode %r: sum or mean" % mode)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input, offsets=None, per_sample_weights=None):
        rows, inverse, padding = self._rows(input)
        return F.embedding_bag(inverse.view(input.shape), rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset,
                               padding_idx=padding)


class _PlainTable:
    """A plain nn.Embedding / nn.EmbeddingBag with sparse=True handed to DistributedOptimizer: its
    weight stays the module's (the user made it, whole, in this process) and out of the flat
    buffer; its rows' updates travel as a table's do. The table holds each row's change since the
    start (zeros at first, so no row is uploaded): the rows' optimizers have no weight decay, so
    the change evolves exactly as the row would. Before each forward the rows of the batch's ids
    become worker 0's initial row plus the table's change (read as a gs.Embedding's rows are); the
    sparse gradient backward leaves is taken from .grad (set back to None, so the wrapped
    optimizer never steps the weight) and handed over with the step. state_dict() reads every row
    first, so a checkpoint holds the current weight."""

    def __init__(self, module, name):
        self.module = module
        self.weight = module.weight
        self.table_name = name
        self.num_embeddings, self.embedding_dim = (int(d) for d in module.weight.shape)
        self.init = "zeros"
        self.row_optimizer = None
        self.seed = 0
        self.max_rows_per_shard = max(1, self.num_embeddings)
        self._opt = None
        self._sync = None
        self._index = -1
        self._base = None  # worker 0's initial weight
        self._grads = []  # this step's sparse gradients (one per backward pass)

    spec = _Table.spec

    def bind(self, opt, index):
        self._opt = weakref.ref(opt)
        self._sync = opt._gs_sync
        self._index = index
        with torch.no_grad():
            if opt._gs_job.size > 1:
                flat = self.weight.detach().contiguous().reshape(-1)
                opt._gs_job.broadcast(flat.numpy(), 0)  # every worker starts from worker 0's rows
                self.weight.copy_(flat.view_as(self.weight))
            self._base = self.weight.detach().clone()
        self.module.register_forward_pre_hook(lambda module, inputs: self._refresh(inputs[0]))
        self.module._register_state_dict_hook(lambda *unused: self._refresh_all())
        accumulator = self.weight.expand_as(self.weight).grad_fn.next_functions[0][0]
        accumulator.register_hook(lambda *unused: self._take_grad())
        self._accumulator = accumulator  # kept alive with its hook

    def _refresh(self, ids, begin=True):
        if begin:
            _begin_step(self._opt, self.module.training)
        ids = torch.unique(ids.reshape(-1).to(torch.int64), sorted=True)
        if ids.numel() and (int(ids[0]) < 0 or int(ids[-1]) >= self.num_embeddings):
            return  # the module's own forward raises torch's error for it
        change = torch.from_numpy(self._sync.read_rows(self._index, ids.numpy().astype(np.uint64)))
        with torch.no_grad():
            self.weight[ids] = self._base[ids] + change

    def _refresh_all(self, chunk=1 << 16):
        for at in range(0, self.num_embeddings, chunk):
            self._refresh(torch.arange(at, min(self.num_embeddings, at + chunk)), begin=False)

    def _take_grad(self):
        g = self.weight.grad
        if g is None:
            return
        if not g.is_sparse:
            raise ValueError("table '%s': its module was made with sparse=True, yet its weight got a dense gradient "
                             "(read outside its forward?)" % self.table_name)
        self._grads.append(g)
        self.weight.grad = None

    def hand_over(self):
        grads, self._grads = self._grads, []
        if not grads:
            return 0
        g = grads[0] if len(grads) == 1 else torch.sparse_coo_tensor(
            torch.cat([x._indices() for x in grads], dim=1), torch.cat([x._values() for x in grads]), grads[0].shape)
        g = g.coalesce()
        ids = g.indices()[0]
        if not ids.numel():
            return 0
        self._sync.set_row_grads(self._index, ids.numpy().astype(np.uint64), g.values().contiguous().numpy())
        return int(ids.numel())

    def forget_step(self):
        self._grads = []


def plain_sparse_tables(named):
    """The [(name, parameter)] that are weights of a live nn.Embedding / nn.EmbeddingBag made with
    sparse=True, as _PlainTables (named by their parameter), in named's order."""
    import gc
    wanted = {id(p): n for n, p in named}
    found = {}
    for m in gc.get_objects():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse and id(m.weight) in wanted:
            found[id(m.weight)] = m
    return [_PlainTable(found[id(p)], n) for n, p in named if id(p) in found]


def tables_of(named, wrapped, sparse_as_dense, config):
    """A DistributedOptimizer's tables: those made before it (claim()) and, unless
    sparse_as_dense (Horovod's: their gradients densified into the flat buffer), the weights of
    plain sparse embeddings among `named` (plain_sparse_tables). Returns (tables, `named` without
    those weights, the tables' TableSpecs for the sync)."""
    plain = [] if sparse_as_dense else plain_sparse_tables(named)
    weights = {id(t.weight) for t in plain}
    tables = claim() + plain
    seed = int(config.get("seed", 0))
    return tables, [(n, p) for n, p in named if id(p) not in weights], [t.spec(i, wrapped, seed)
                                                                           for i, t in enumerate(tables)]


def bind(tables, opt):
    """Binds each table to `opt` (its sync built), at its index; returns 0 (no rows handed yet)."""
    for i, t in enumerate(tables):
        t.bind(opt, i)
    return 0


def claim():
    """The tables made and not yet bound, in the order they were made (DistributedOptimizer binds
    them)."""
    tables = [r() for r in _UNBOUND]
    del _UNBOUND[:]
    return [t for t in tables if t is not None]


def _row_optimizer(named, wrapped):
    """(kind, TableSpec options) for `named` ("sgd" | "adagrad" | "adam" | None: the wrapped
    optimizer's kind)."""
    group = wrapped.param_groups[0] if wrapped is not None and wrapped.param_groups else {}
    if named is None:
        cls = type(wrapped).__name__ if wrapped is not None else "SGD"
        named = {"SGD": "sgd", "Adam": "adam", "AdamW": "adam", "SparseAdam": "adam", "Adagrad": "adagrad"}.get(cls)
        if named is None:
            raise ValueError("the rows of an embedding table are updated with sgd, row-wise adagrad or lazy adam; "
                             "torch.optim.%s has no row rule: name one (gradsync.torch.Embedding(..., optimizer=...))"
                             % cls)
    options = {}
    if named == "adam":
        betas = group.get("betas", (0.9, 0.999))
        options = {"beta1": float(betas[0]), "beta2": float(betas[1]), "eps": float(group.get("eps", 1e-8))}
    elif named == "adagrad":
        options = {"eps": float(group.get("eps", 1e-10)),
                   "initial_accumulator": float(group.get("initial_accumulator_value", 0.0))}
    elif named != "sgd":
        raise ValueError("embedding table optimizer %r: sgd, adagrad (row-wise) or adam (lazy)" % named)
    return named, options

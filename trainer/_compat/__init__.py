"""The private Keras and TensorFlow attributes the trainer reads, one module per internal it depends on.

Each names the versions it was checked on (the supported range is setup.cfg's,
tested at both ends by CI); a hook whose target is gone is named before the
first call (`platform`), so a release that moves one breaks there, not
somewhere in a step function. The rest of the trainer imports them from here, as `_compat.<name>`:

- `replicas`: a package, by hook family: Keras's replica scaling of losses and gradients, its optimizer's
  clipping and accumulation, synchronized BatchNormalization's statistics, the
  updates of a variable summed over replicas (hooked while a step is traced);
- `sharded`: ParameterServerStrategy's ShardedVariable;
- `variables`: the tf.Variable behind a Keras variable, the optimizer's strategy
  and indices, a model's state;
- `compiled`: Keras's compiled loss and metrics, metric variables across replicas;
- `random_state`: Keras's global seed state and its TensorFlow random functions;
- `activity`: activity regularizers, a mean or a sum over the batch by version;
- `dict_inputs`: how Keras takes a dict of data for a model's inputs;
- `adapters`: Keras's data adapters (generators, PyDataset, grain), tf.data's
  shuffles;
- `auto_shard`: tf.data's file-level auto-sharding, for one shard of a dataset's files;
- `distributed_data`: what a dataset the user distributed with a strategy was
  made from;
- `keras_methods`: Keras's backend fit, evaluate and predict, routed to the
  trainer's engine;
- `strategies`: MirroredStrategy's collective keys, MultiWorkerMirroredStrategy's
  devices on a CPU worker;
- `coordination`: the coordination service's key-value store, and the SIGTERM handler it takes;
- `patches`: the install of the Keras functions that `replicas` and
  `trainer.engine.draws` replace while a step is traced;
- `version`, `platform`: the versions CI tests and the gates within them; the
  check, before a call, that the versions are tested and every hook's target is
  there (refused otherwise, unless the user opts in);
- `onednn`, `slurm`, `masks`: oneDNN's state, Slurm's host lists, Keras masks.
"""

from __future__ import annotations

from .version import KERAS_VERSION, batch_end_index, debug_limits  # noqa: F401
from .platform import check as check_platform  # noqa: F401
from .masks import get_keras_mask, set_keras_mask  # noqa: F401
from .slurm import expand_hostlist, expand_tasks_per_node  # noqa: F401
from .variables import (  # noqa: F401
    all_layers,
    backing,
    build_model_only,
    forget_traced_functions,
    model_state,
    optimizer_strategy,
    reindex,
    scalar_reads,
    schedule_of,
    seed_states,
    set_backing,
    set_optimizer_strategy,
    step_counter,
    sublayers,
)
from .compiled import (  # noqa: F401
    compile_loss,
    compile_metrics,
    compiled_metric_list,
    compiled_specs,
    compute_loss,
    loss_tracker,
    metric_variables_on_read,
    requested_initial_epoch,
    resolved_loss,
    results_recorded,
    symbolic_build,
)
from .sharded import gradients, is_sharded  # noqa: F401
from .patches import Patches  # noqa: F401
from .replicas import replica_hooks, replica_share  # noqa: F401
from .random_state import (  # noqa: F401
    RANDOM_FUNCTIONS,
    global_random_state_kept,
    keras_random_module,
    keras_seed,
    noise_shape,
    seeded,
)
from .activity import activity_layers, activity_share  # noqa: F401
from .dict_inputs import DictFeed, dict_feed  # noqa: F401
from .adapters import (  # noqa: F401
    KerasView,
    adapter_warnings,
    dataset_shuffles,
    declared_batch_size,
    first_batch,
    grain_record_batches,
    is_grain_dataset,
    keras_adapter,
    keras_view,
    service_jobs,
)
from .auto_shard import file_shard  # noqa: F401
from .distributed_data import distributed_source, is_distributed_dataset  # noqa: F401
from .keras_methods import KERAS_METHODS, is_model, keras_methods_hooked, on_batch_resets_metrics  # noqa: F401
from .onednn import onednn_enabled  # noqa: F401
from .strategies import (  # noqa: F401
    collective_group_keys,
    collective_key_base,
    collectives_serve_a_cluster,
    number_instances_from,
    parameter_server_tasks,
    worker_cpu_replicas,
)
from .coordination import cluster_key, cluster_store_running, put_cluster_key, sigterm_kept  # noqa: F401

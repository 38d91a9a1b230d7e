"""The private Keras and TensorFlow attributes the trainer reads, one module per internal it depends on.

The rest of the trainer imports them from here, as `_compat.<name>`, and touches no private attribute itself.
Each module names the versions it was checked on; `platform` refuses, before the first call, versions outside
the range CI tests and any hook whose target is gone, so a release that moves one breaks there, not somewhere
in a step function. The modules one by one: docs/design.md, "`_compat/`, module by module".
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
from .keras_methods import (  # noqa: F401
    KERAS_METHODS,
    is_model,
    keras_methods_hooked,
    on_batch_resets_metrics,
    one_step_calls_past_end,
    warns_when_unknown_size_ends,
)
from .onednn import onednn_enabled  # noqa: F401
from . import iterator_state  # noqa: F401
from .iterator_state import unsaved_state  # noqa: F401
from .compile_requests import made_in_strategy_scope, noted as compile_noted, supports_jit  # noqa: F401
from .strategies import (  # noqa: F401
    collective_group_keys,
    collective_key_base,
    collectives_serve_a_cluster,
    number_instances_from,
    parameter_server_tasks,
    worker_cpu_replicas,
)
from .coordination import cluster_key, cluster_store_running, put_cluster_key, sigterm_kept  # noqa: F401

"""rollflow's artifact store: the Parquet rollout schema, refs, atomic writes, hashes, run paths.

Everything a stage hands to the next is a file written through this package (atomically, with
a verifiable checksum) and referred to by an ``ArtifactRef``. See DESIGN §3.
"""

from artifacts.atomic import (
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    sha256_bytes,
    sha256_file,
)
from artifacts.schema import (
    SAMPLE_SCHEMA,
    SAMPLE_STATUSES,
    SCHEMA_VERSION,
    Sample,
    samples_to_table,
    table_to_samples,
)
from artifacts.store import (
    ArtifactError,
    ArtifactRef,
    RunPaths,
    append_metrics,
    read_metadata,
    read_metrics,
    read_rollout,
    read_table,
    table_content_sha256,
    write_rollout,
    write_table,
)

__all__ = [
    "SAMPLE_SCHEMA",
    "SAMPLE_STATUSES",
    "SCHEMA_VERSION",
    "ArtifactError",
    "ArtifactRef",
    "RunPaths",
    "Sample",
    "append_metrics",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "read_metadata",
    "read_metrics",
    "read_rollout",
    "read_table",
    "samples_to_table",
    "sha256_bytes",
    "sha256_file",
    "table_content_sha256",
    "table_to_samples",
    "write_rollout",
    "write_table",
]

"""Lets a CPU-only vLLM engine offload KV to its CPU tier, for the engine suite.

Stock vLLM refuses offloading on a CPU platform: CPUOffloadingSpec.get_worker
raises ("only supported on CUDA-alike and XPU GPUs") and its copy handler runs
CUDA streams. This spec replaces exactly that one piece, the worker-side copy
between the engine's KV cache and the offload region:

* the region is vLLM's own SharedOffloadRegion, built with the same arguments
  as TieringOffloadingSpec.create_worker, so the scheduler's tiers (peerkv, or
  the stock "p2p" tier) see the same /dev/shm mapping they see on a GPU host;
* the copy addresses are computed by vLLM's own handler code
  (SingleDirectionOffloadingHandler._fill_direct_ops, the worker-private
  layout), and each whole page is copied with memmove, synchronously (a CPU
  forward pass has finished writing the KV before the connector submits).

Everything else — scheduler, OffloadingConnector, primary CPU tier, secondary
tiers, HTTP server — is vLLM's code. Select it with
    "spec_name": "CPUTestTieringSpec", "spec_module_path": "cpu_offload_spec"
and this directory on PYTHONPATH.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
import torch
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.gpu_worker import SingleDirectionOffloadingHandler
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


class _MemmoveCopier:
    """One direction of copies. Carries the attributes vLLM's
    _fill_direct_ops reads, so the addresses are vLLM's."""

    _fill_direct_ops = SingleDirectionOffloadingHandler._fill_direct_ops

    def __init__(self, engine_tensors, region_tensors, blocks_per_chunk, layer_refs, to_region):
        self.src_tensors = region_tensors if not to_region else engine_tensors
        self.dst_tensors = engine_tensors if not to_region else region_tensors
        self.layer_refs_per_group = layer_refs
        # The region holds chunks of blocks_per_chunk engine blocks.
        self.src_blocks_per_chunk = 1 if to_region else blocks_per_chunk
        self.dst_blocks_per_chunk = blocks_per_chunk if to_region else 1
        self.to_region = to_region
        self.finished: list[TransferResult] = []

    def copy(self, job_id, src_spec, dst_spec) -> bool:
        start = time.monotonic()
        engine_spec = src_spec if self.to_region else dst_spec
        src_blocks, dst_blocks = src_spec.block_ids, dst_spec.block_ids
        n_ops = sum(engine_spec.group_sizes) * max(
            (len(refs) for refs in self.layer_refs_per_group), default=0
        )
        all_src = np.empty(n_ops, dtype=np.uint64)
        all_dst = np.empty(n_ops, dtype=np.uint64)
        all_sizes = np.empty(n_ops, dtype=np.int64)
        op_idx = src_off = dst_off = total = 0
        # The same walk as vLLM's transfer_async: per KV-cache group, skip the
        # sub-blocks before the group's logical offset in its first chunk.
        for g_idx, (size, block_idx) in enumerate(
            zip(engine_spec.group_sizes, engine_spec.block_indices)
        ):
            if size == 0:
                continue
            src_skip = block_idx % self.src_blocks_per_chunk
            dst_skip = block_idx % self.dst_blocks_per_chunk
            n_src = cdiv(size + src_skip, self.src_blocks_per_chunk)
            n_dst = cdiv(size + dst_skip, self.dst_blocks_per_chunk)
            op_idx, nbytes = self._fill_direct_ops(
                g_idx,
                group_src=src_blocks[src_off : src_off + n_src],
                group_dst=dst_blocks[dst_off : dst_off + n_dst],
                group_size=size,
                src_skip_count=src_skip,
                dst_skip_count=dst_skip,
                all_src=all_src,
                all_dst=all_dst,
                all_sizes=all_sizes,
                op_idx=op_idx,
            )
            total += nbytes
            src_off += n_src
            dst_off += n_dst
        if src_off != len(src_blocks) or dst_off != len(dst_blocks):
            raise ValueError(
                f"job {job_id}: {len(src_blocks)}/{len(dst_blocks)} blocks given, "
                f"{src_off}/{dst_off} described by the group sizes"
            )
        for src, dst, size in zip(all_src[:op_idx], all_dst[:op_idx], all_sizes[:op_idx]):
            ctypes.memmove(int(dst), int(src), int(size))
        self.finished.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=total,
                transfer_time=time.monotonic() - start,
            )
        )
        return True


class MemmoveOffloadingWorker(OffloadingWorker):
    def __init__(self, kv_caches, blocks_per_chunk: int, region: SharedOffloadRegion):
        self._region = region
        engine_tensors, region_tensors = [], []
        for kv in kv_caches.tensors:
            page = kv.page_size_bytes
            engine_tensors.append(kv.tensor.view(torch.int8).view((-1, page)))
            region_tensors.append(region.create_next_worker_view(page * blocks_per_chunk))
        refs = kv_caches.group_data_refs
        self._store = _MemmoveCopier(engine_tensors, region_tensors, blocks_per_chunk, refs, True)
        self._load = _MemmoveCopier(engine_tensors, region_tensors, blocks_per_chunk, refs, False)

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self._store.copy(job_id, src_spec, dst_spec)

    def submit_load(self, job_id, src_spec, dst_spec) -> bool:
        return self._load.copy(job_id, src_spec, dst_spec)

    def get_finished(self) -> list[TransferResult]:
        done = self._store.finished + self._load.finished
        self._store.finished, self._load.finished = [], []
        return done

    def wait(self, job_ids: set[int]) -> None:
        pass  # copies complete inside submit_*

    def shutdown(self) -> None:
        if self._region is not None:
            self._region.cleanup()
            self._region = None


def _allow_amx() -> None:
    """vLLM's CPU attention runs its AMX kernel (bf16, block size a multiple of
    32) wherever the CPU has AMX tiles, but never asks Linux for the right to
    use them (arch_prctl ARCH_REQ_XCOMP_PERM, granted per process), so on a
    Sapphire Rapids or later host the worker dies of SIGILL the first time
    that kernel runs, unless something else in the process asked first. The
    worker builds its offloading worker before any forward pass: ask here."""
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private: torch 2.13
    init = getattr(torch.cpu, "_init_amx", None)
    if supported is None or init is None:
        raise RuntimeError("this torch has no torch.cpu._init_amx: update _allow_amx for it")
    if supported() and not init():
        raise RuntimeError("this CPU has AMX tiles but Linux refused the worker the right to use them")


class CPUTestTieringSpec(TieringOffloadingSpec):
    def get_worker(self, kv_caches):
        if self._worker is None:
            _allow_amx()
            if self.config.canonical_layout:
                raise ValueError("CPUTestTieringSpec copies the worker-private layout only")
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                self._worker = MemmoveOffloadingWorker(kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise
        return self._worker

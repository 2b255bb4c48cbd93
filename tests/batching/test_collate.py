import numpy as np
import pytest
import torch

from shardmix.batching.collate import collate_samples
from shardmix.errors import DecodeError


def sample(i, **fields):
    return {"__key__": f"k{i}", "__source__": f"s{i % 2}.tar", "__index__": i, **fields}


def test_collates_like_default_collate_with_provenance():
    batch = collate_samples(
        [sample(i, label=i * 10, x=np.full(3, i, np.float32), txt=b"t%d" % i) for i in range(4)]
    )
    assert batch["__key__"] == ["k0", "k1", "k2", "k3"]
    assert batch["__source__"] == ["s0.tar", "s1.tar", "s0.tar", "s1.tar"]
    assert torch.equal(batch["__index__"], torch.tensor([0, 1, 2, 3]))
    assert torch.equal(batch["label"], torch.tensor([0, 10, 20, 30]))
    assert batch["x"].shape == (4, 3) and batch["x"].dtype == torch.float32
    assert batch["txt"] == [b"t0", b"t1", b"t2", b"t3"]


def test_ragged_arrays_stay_a_list():
    batch = collate_samples([sample(i, ids=np.arange(i + 1)) for i in range(3)])
    assert [t.tolist() for t in batch["ids"]] == [[0], [0, 1], [0, 1, 2]]


def test_mismatched_fields_name_the_sample():
    with pytest.raises(DecodeError, match=r"'k1' from s1.tar has no field 'label'"):
        collate_samples([sample(0, label=1), sample(1)])
    with pytest.raises(DecodeError, match=r"'k1' from s1.tar has fields"):
        collate_samples([sample(0), sample(1, extra=2)])

#!/usr/bin/env python3
"""Writes the fixtures of Tests/OrchardFlowerTests/Fixtures with flwr's own classes (flwr 1.41.0, numpy).

Run with the Python that has flwr installed: `/opt/flwr-venv/bin/python Tools/flower-proto/make_fixtures.py`.
Every message fixture is one JSON file: each object's bytes (base64) by id, the order a SuperNode pushes them,
the ObjectTree and the push-messages `Message` as flwr serialises them, and the values flwr decodes back.
`npy.json` holds numpy's own `.npy` bytes for a range of dtypes and shapes. The output is deterministic: the
clock flwr reads is fixed, and `multichunk.json` is written by a second run of this script with a 256-byte
chunk size (flwr reads `FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE` when it is imported).
"""

import base64
import datetime
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[2] / "Tests" / "OrchardFlowerTests" / "Fixtures"
SMALL_CHUNK_SIZE = 256
# 2025-06-01T12:00:00.123456Z, the instant the ServerApp "creates" its messages.
SENT_AT = datetime.datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=datetime.UTC)
# The instant the ClientApp "replies": 3.25 s later.
REPLIED_AT = SENT_AT + datetime.timedelta(seconds=3, microseconds=250000)


def b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def write(name: str, value: object) -> None:
    path = OUT / name
    path.write_text(json.dumps(value, indent=1, ensure_ascii=True) + "\n")
    print(f"wrote {path.relative_to(OUT.parents[2])} ({path.stat().st_size} bytes)")


def set_clock(instant: datetime.datetime) -> None:
    import flwr.app.message.message as message_module

    message_module.now = lambda: instant


def as_server_app() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id = 7384020251
    TaskIdentity.node_id = 1
    TaskIdentity.task_id = 12


def float32(values, shape) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).reshape(shape)


def expected_value(proto_value, value) -> dict:
    """A record value as the tests read it: the protobuf field flwr chose, and the value (ints as strings)."""
    kind = proto_value.WhichOneof("value")

    def scalar(v):
        if isinstance(v, bytes):
            return b64(v)
        if isinstance(v, bool) or isinstance(v, float) or isinstance(v, str):
            return v
        return str(v)

    return {"type": kind, "value": [scalar(v) for v in value] if isinstance(value, list) else scalar(value)}


def expected_message(message) -> dict:
    from flwr.app.message import ArrayRecord, ConfigRecord, MetricRecord
    from flwr.proto.recorddict_pb2 import ConfigRecord as ProtoConfigRecord
    from flwr.proto.recorddict_pb2 import MetricRecord as ProtoMetricRecord
    from flwr.supercore.inflatable.inflatable_object import get_object_body

    md = message.metadata
    optional = lambda v: None if v is None else str(v)
    out = {
        "metadata": {
            "run_id": str(md.run_id), "message_id": md.message_id, "src_node_id": str(md.src_node_id),
            "dst_node_id": str(md.dst_node_id), "reply_to_message_id": md.reply_to_message_id,
            "group_id": md.group_id, "ttl": md.ttl, "message_type": md.message_type, "created_at": md.created_at,
            "src_task_id": optional(md.src_task_id), "dst_task_id": optional(md.dst_task_id),
        },
        "content": None,
        "error": None,
    }
    if message.has_error():
        out["error"] = {"code": message.error.code, "reason": message.error.reason or ""}
        return out
    records = []
    for name, record in message.content.items():
        if isinstance(record, ArrayRecord):
            items = []
            for array_name, array in record.items():
                nd = array.numpy()
                item = {"name": array_name, "dtype": array.dtype, "shape": list(array.shape), "data": b64(nd.tobytes())}
                if nd.dtype.kind == "f":
                    item["values"] = [float(v) for v in nd.reshape(-1)]
                items.append(item)
            records.append({"name": name, "kind": "arrays", "items": items})
        else:
            proto_class = ProtoMetricRecord if isinstance(record, MetricRecord) else ProtoConfigRecord
            proto = proto_class.FromString(get_object_body(record.deflate(), type(record)))
            items = [{"key": item.key, **expected_value(item.value, record[item.key])} for item in proto.items]
            kind = "metrics" if isinstance(record, MetricRecord) else "configs"
            records.append({"name": name, "kind": kind, "items": items})
    out["content"] = records
    return out


def message_fixture(message, **extra) -> dict:
    """Deflates `message` as a SuperNode pushes it, and checks that flwr inflates the objects back to it."""
    from flwr.app.message import Message, remove_content_from_message
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.common.serde import message_to_proto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    message_id = message.object_id
    # As the SuperLink and flwr's push_message do: a message's id is its object id.
    message.metadata.__dict__["_message_id"] = message_id
    objects = {object_id: obj.deflate() for object_id, obj in get_all_nested_objects(message).items()}
    inflated = inflate_object_from_contents(message_id, dict(objects), keep_object_contents=True)
    assert isinstance(inflated, Message)
    inflated.metadata.__dict__["_message_id"] = message_id
    expected = expected_message(message)
    assert expected_message(inflated) == expected
    return {
        "flwr_version": __import__("flwr").__version__,
        "chunk_size": FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE,
        "message_id": message_id,
        "objects": {object_id: b64(content) for object_id, content in objects.items()},
        "push_order": list(objects),
        "object_tree": b64(get_object_tree(message).SerializeToString(deterministic=True)),
        "pushed_message": b64(
            message_to_proto(remove_content_from_message(message)).SerializeToString(deterministic=True)
        ),
        "expected": expected,
        **extra,
    }


def train_message():
    from flwr.app.message import Array, ArrayRecord, ConfigRecord, Message, RecordDict

    arrays = ArrayRecord({
        "conv.weight": Array(float32(np.arange(30) / 7 - 2, (2, 3, 5))),
        "conv.bias": Array(float32([0.5], ())),
        "scale": Array(float32([1.25], (1,))),
    })
    config = ConfigRecord({
        "lr": 0.05, "local-epochs": 2, "optimizer": "sgd", "nesterov": True, "decay-steps": [10, 20, 30],
        "betas": [0.9, 0.999], "tags": ["a", "é"], "flags": [True, False], "seed-bytes": b"\x00\x01\xff",
        "chunks": [b"ab", b""], "big": 2**63 + 5, "bigs": [1, 2**64 - 1], "offset": -3, "zero": 0.0, "name": "",
        "empty": [],
    })
    return Message(RecordDict({"arrays": arrays, "config": config}), dst_node_id=9876543210, message_type="train",
                   group_id="1")


def write_messages() -> None:
    from flwr.app.error import Error
    from flwr.app.message import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    as_server_app()
    set_clock(SENT_AT)
    train = train_message()
    train_fixture = message_fixture(train)
    write("train.json", train_fixture)

    evaluate = Message(
        RecordDict({"arrays": ArrayRecord({"w": Array(float32([[1, -2], [3.5, 1e-8]], (2, 2)))}),
                    "config": ConfigRecord({"server-round": 2})}),
        dst_node_id=9876543210, message_type="evaluate", group_id="2", ttl=600.5,
    )
    write("evaluate.json", message_fixture(evaluate))

    # The ClientApp's answers, made with flwr's reply constructor at a fixed instant.
    set_clock(REPLIED_AT)
    reply_meta = {"reply_to": "train", "replied_at_microseconds": int(REPLIED_AT.timestamp()) * 1_000_000
                  + REPLIED_AT.microsecond}
    updated = ArrayRecord({
        "conv.weight": Array(float32(np.arange(30) / 9, (2, 3, 5))),
        "conv.bias": Array(float32([0.375], ())),
        "scale": Array(float32([1.0], (1,))),
    })
    metrics = MetricRecord({"num-examples": 120, "loss": 0.25, "accuracy-history": [0.5, 0.75], "steps": [3, 4],
                            "empty": []})
    reply = Message(RecordDict({"arrays": updated, "metrics": metrics}), reply_to=train)
    write("train_reply.json", message_fixture(reply, **reply_meta))
    error = Message(Error(code=2, reason="ClientApp raised: out of memory"), reply_to=train)
    write("error_reply.json", message_fixture(error, **reply_meta))


def write_multichunk() -> None:
    """Arrays spanning several 256-byte chunks, identical chunks, arrays and records, names JSON must escape."""
    from flwr.app.message import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    as_server_app()
    set_clock(SENT_AT)
    zeros = np.zeros(200, dtype=np.float32)
    arrays = ArrayRecord({
        "zeros": Array(zeros),
        "ramp": Array(np.arange(50, dtype=np.float64) / 3),
        "twin": Array(zeros.copy()),
        'quote"back\\slash\ttab\u007f é😀': Array(float32([7], (1, 1))),
        "steps": Array(np.arange(3, dtype=np.int64) - 1),
        "mask": Array(np.array([True, False, True])),
        "bytes": Array(np.arange(5, dtype=np.uint8)),
    })
    content = RecordDict({
        "arrays": arrays,
        "cfg-é": ConfigRecord({"x": 1}),
        "cfg-copy": ConfigRecord({"x": 1}),
        "no-metrics": MetricRecord(),
    })
    message = Message(content, dst_node_id=5, message_type="query.inspect", ttl=30)
    write("multichunk.json", message_fixture(message))


def npy_bytes(array: np.ndarray, version=None) -> bytes:
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buffer, array, version=version, allow_pickle=False)
    return buffer.getvalue()


def write_npy() -> None:
    def case(name, array, **extra):
        array = np.asarray(array)
        return {"name": name, "dtype": str(array.dtype), "descr": array.dtype.str, "shape": list(array.shape),
                "data": b64(np.ascontiguousarray(array).tobytes()), "npy": b64(npy_bytes(array)), **extra}

    written = [
        case("f4 matrix", float32(np.arange(6) / 3, (2, 3))),
        case("f4 scalar", float32([3.5], ())),
        case("f4 one", float32([-1], (1,))),
        case("f4 empty", np.zeros((0,), dtype=np.float32)),
        case("f4 empty rows", np.zeros((0, 3), dtype=np.float32)),
        case("f4 huge empty", np.zeros((1234567890123, 0), dtype=np.float32)),
        case("f4 rank 4", float32(np.arange(24), (2, 3, 4, 1))),
        case("f8 vector", np.array([0.1, -2.5, 1e300, 5e-324])),
        case("i1", np.array([-128, 0, 127], dtype=np.int8)),
        case("i2", np.array([-32768, 1, 32767], dtype=np.int16)),
        case("i4", np.array([[1, -2], [2**31 - 1, -(2**31)]], dtype=np.int32)),
        case("i8", np.array([-(2**63), 0, 2**63 - 1], dtype=np.int64)),
        case("u1", np.arange(5, dtype=np.uint8)),
        case("u2", np.array([0, 65535], dtype=np.uint16)),
        case("u4", np.array([0, 2**32 - 1], dtype=np.uint32)),
        case("u8", np.array([0, 2**64 - 1], dtype=np.uint64)),
        case("b1", np.array([[True, False], [False, True]])),
    ]
    versions = []
    for version in [(1, 0), (2, 0), (3, 0)]:
        array = float32([1, 2], (2,))
        versions.append({**case(f"version {version[0]}.0", array), "npy": b64(npy_bytes(array, version))})
    # Fortran-order arrays as flwr itself serialises them (`ndarray_to_bytes`, what a ServerApp's transposed or
    # `np.asfortranarray` matrix becomes), with their elements in C order as "data".
    from flwr.common import ndarray_to_bytes

    def fortran_case(name, array):
        assert array.flags["F_CONTIGUOUS"] and not array.flags["C_CONTIGUOUS"]
        return {**case(name, array), "npy": b64(ndarray_to_bytes(array))}

    fortran = [
        fortran_case("f4 matrix, asfortranarray", np.asfortranarray(float32(np.arange(6) / 4, (2, 3)))),
        fortran_case("f4 matrix, transposed", float32(np.arange(12) - 5, (3, 4)).T),
        fortran_case("f8 rank 3, asfortranarray", np.asfortranarray(np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7)),
        fortran_case("i4 rank 4, transposed", np.arange(120, dtype=np.int32).reshape(2, 3, 4, 5).T),
    ]
    refused = [
        {"name": "big-endian f4", "npy": b64(npy_bytes(np.array([1, 2], dtype=">f4"))), "code": "unsupported_dtype"},
        {"name": "complex64", "npy": b64(npy_bytes(np.array([1j], dtype=np.complex64))), "code": "unsupported_dtype"},
        {"name": "float16", "npy": b64(npy_bytes(np.array([1], dtype=np.float16))), "code": "unsupported_dtype"},
        {"name": "unicode", "npy": b64(npy_bytes(np.array(["ab"]))), "code": "unsupported_dtype"},
    ]
    write("npy.json", {"numpy_version": np.__version__, "written": written, "read": versions, "fortran": fortran, "refused": refused})


def main() -> None:
    if sys.argv[1:] == ["--multichunk"]:
        write_multichunk()
        return
    OUT.mkdir(parents=True, exist_ok=True)
    write_npy()
    write_messages()
    env = dict(os.environ, FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE=str(SMALL_CHUNK_SIZE))
    subprocess.run([sys.executable, __file__, "--multichunk"], env=env, check=True)


if __name__ == "__main__":
    main()

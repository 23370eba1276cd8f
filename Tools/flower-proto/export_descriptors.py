"""Writes the FileDescriptorSet of the Fleet API as the installed flwr defines it (fleet.proto and every file it
imports, transitively), for protoc's --descriptor_set_in. The wheel ships compiled *_pb2 modules, not .proto
sources; their descriptors are the exact schema the SuperLink speaks.

    python3 Tools/flower-proto/export_descriptors.py /tmp/flower.pb
"""
import sys

import flwr
from flwr.proto import fleet_pb2
from google.protobuf import descriptor_pb2

PINNED = "1.41.0"


def main() -> None:
    if flwr.__version__ != PINNED:
        sys.exit(f"flwr {flwr.__version__} is installed; Orchard pins {PINNED} (pip install flwr=={PINNED})")
    out = descriptor_pb2.FileDescriptorSet()
    seen = set()

    def add(file_descriptor) -> None:
        if file_descriptor.name in seen:
            return
        seen.add(file_descriptor.name)
        for dependency in file_descriptor.dependencies:
            add(dependency)  # dependencies first, as protoc expects
        proto = descriptor_pb2.FileDescriptorProto()
        file_descriptor.CopyToProto(proto)
        out.file.append(proto)

    add(fleet_pb2.DESCRIPTOR)
    with open(sys.argv[1], "wb") as f:
        f.write(out.SerializeToString())
    for proto in out.file:
        print(proto.name)


if __name__ == "__main__":
    main()

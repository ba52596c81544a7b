"""Independent readers for the metrics tests: decodes TensorBoard event files
with the protobuf package (descriptors written here, checked against
tensorboard's event.proto / summary.proto) and parses SVG with a real XML parser.
Prints JSON on stdout.

  metrics_oracle.py events FILE   -> [{"wall_time", "step", "file_version"?, "scalars"?, "session_log"?}]
  metrics_oracle.py svg FILE      -> {"root", "polylines": [point counts], "texts": [...]}
"""
import json
import struct
import sys
import xml.etree.ElementTree as ET

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def event_class():
    # proto2: every field has presence (HasField), and the wire format is the same.
    proto = descriptor_pb2.FileDescriptorProto(name="colossus_test_event.proto", package="tbtest", syntax="proto2")

    def field(msg, name, number, ftype, type_name=None, repeated=False):
        f = msg.field.add(name=name, number=number, type=ftype,
                          label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name

    summary = proto.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    field(value, "tag", 1, F.TYPE_STRING)
    field(value, "simple_value", 2, F.TYPE_FLOAT)
    field(summary, "value", 1, F.TYPE_MESSAGE, ".tbtest.Summary.Value", repeated=True)
    session_log = proto.message_type.add(name="SessionLog")
    field(session_log, "status", 1, F.TYPE_INT32)  # an enum on the wire is a varint
    event = proto.message_type.add(name="Event")
    field(event, "wall_time", 1, F.TYPE_DOUBLE)
    field(event, "step", 2, F.TYPE_INT64)
    field(event, "file_version", 3, F.TYPE_STRING)
    field(event, "summary", 5, F.TYPE_MESSAGE, ".tbtest.Summary")
    field(event, "session_log", 7, F.TYPE_MESSAGE, ".tbtest.SessionLog")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tbtest.Event"))


def crc32c(data):
    # Bit-at-a-time, deliberately unlike the table-driven C++ code under test.
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        assert length_crc == masked(crc32c(header)), f"length crc mismatch at {pos}"
        payload = data[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        assert data_crc == masked(crc32c(payload)), f"data crc mismatch at {pos}"
        yield payload
        pos += 16 + length
    assert pos == len(data), "trailing bytes"


def events(path):
    Event = event_class()
    out = []
    for payload in read_records(path):
        e = Event()
        e.ParseFromString(payload)
        item = {"wall_time": e.wall_time, "step": e.step}
        if e.HasField("file_version"):
            item["file_version"] = e.file_version
        if e.HasField("summary"):
            item["scalars"] = [[v.tag, v.simple_value] for v in e.summary.value]
        if e.HasField("session_log"):
            item["session_log"] = e.session_log.status
        out.append(item)
    return out


def svg(path):
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    polylines = [len(p.get("points").split()) for p in root.iter(ns + "polyline")]
    texts = ["".join(t.itertext()) for t in root.iter(ns + "text")]
    return {"root": root.tag, "polylines": polylines, "texts": texts}


if __name__ == "__main__":
    command, path = sys.argv[1], sys.argv[2]
    print(json.dumps(events(path) if command == "events" else svg(path)))

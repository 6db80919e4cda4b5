"""Protobuf messages as the JSON that Triton's HTTP endpoints answer.

``google.protobuf.json_format`` writes 64-bit integers as strings and camel-cases names; Triton's
REST answers (metadata, model configuration, statistics) keep the proto field names and write
integers as numbers, which is what ``tritonclient.http`` and curl users read. Every scalar field
is written, defaults included (a statistics count of 0 is there to read); an unset message or
oneof member is left out.
"""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        number = field.enum_type.values_by_number.get(value)
        return number.name if number is not None else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


def _is_map(field: FieldDescriptor) -> bool:
    message = field.message_type
    return message is not None and message.GetOptions().map_entry


def message_json(message: Message) -> dict[str, Any]:
    """``message`` as a JSON object with the proto field names."""
    document: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            document[field.name] = {str(k): _scalar(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            document[field.name] = [_scalar(field, v) for v in value]
        elif field.containing_oneof is not None or field.type == FieldDescriptor.TYPE_MESSAGE:
            if message.HasField(field.name):
                document[field.name] = _scalar(field, value)
        else:
            document[field.name] = _scalar(field, value)
    return document

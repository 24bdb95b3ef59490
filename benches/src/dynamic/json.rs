//! JSON ↔ protobuf through run-time descriptors, with the proto3 JSON mapping (prost-reflect's
//! serde support): field names in lowerCamelCase or as written in the .proto, 64-bit integers as
//! numbers or strings, enums by name or number, `bytes` as base64, well-known types in their
//! JSON forms (`"2024-01-01T00:00:00Z"`, `"1.5s"`, ...).
//!
//! An input that does not match the message is reported with the field's path and type, found by
//! checking the fields one by one once the whole message failed (so the happy path parses once).

use std::io::Read as _;

use bytes::Bytes;
use prost::Message as _;
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, SerializeOptions};
use serde_json::Value;

use crate::error::PerfError;

/// A request body encoded once from JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload {
    /// The protobuf encoding.
    pub bytes: Bytes,
    /// Where it came from (`--data #1`, `@file.json[2]`), for messages.
    pub origin: String,
}

/// Encodes the JSON `value` as message `desc`.
///
/// # Errors
/// A one-line message naming the field path, its type and what was wrong (an unknown field
/// names the message and its fields).
pub fn encode(desc: &MessageDescriptor, value: &Value) -> Result<Bytes, String> {
    match DynamicMessage::deserialize(desc.clone(), value) {
        Ok(m) => Ok(Bytes::from(m.encode_to_vec())),
        Err(e) => {
            Err(diagnose(desc, value, "").unwrap_or_else(|| format!("message {}: {e}", desc.full_name())))
        }
    }
}

/// Parses JSON text (one value).
///
/// # Errors
/// serde_json's reason with line and column.
pub fn parse(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))
}

/// Reads `--data` arguments into request bodies of `desc`: each is JSON text, `@FILE` (a JSON
/// object, or an array of them for several payloads) or `-` (standard input, same forms). With
/// none, one empty message (`{}`).
///
/// # Errors
/// [`PerfError::Setup`] naming the argument and, for a mismatch, the field and its type.
pub fn payloads(desc: &MessageDescriptor, data: &[String]) -> Result<Vec<Payload>, PerfError> {
    let default = ["{}".to_string()];
    let data = if data.is_empty() { &default[..] } else { data };
    let mut out = Vec::new();
    for (i, arg) in data.iter().enumerate() {
        let (origin, text, from_file) = if arg == "-" {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|source| PerfError::Io {
                what: "--data -: reading standard input".into(),
                source,
            })?;
            ("--data - (stdin)".to_string(), s, true)
        } else if let Some(path) = arg.strip_prefix('@') {
            let s = std::fs::read_to_string(path)
                .map_err(|source| PerfError::Io { what: format!("--data @{path}"), source })?;
            (format!("--data @{path}"), s, true)
        } else {
            (
                if data.len() > 1 { format!("--data #{}", i + 1) } else { "--data".to_string() },
                arg.clone(),
                false,
            )
        };
        let value = parse(&text).map_err(|e| PerfError::Setup(format!("{origin}: {e}")))?;
        let values = match value {
            Value::Array(items) if from_file => {
                if items.is_empty() {
                    return Err(PerfError::Setup(format!("{origin}: an empty array has no payload")));
                }
                items.into_iter().enumerate().map(|(j, v)| (format!("{origin}[{j}]"), v)).collect()
            }
            v => vec![(origin, v)],
        };
        for (origin, v) in values {
            let bytes = encode(desc, &v).map_err(|e| PerfError::Setup(format!("{origin}: {e}")))?;
            out.push(Payload { bytes, origin });
        }
    }
    Ok(out)
}

/// Decodes `bytes` as message `desc` and prints it as pretty JSON (proto3 mapping: default
/// values omitted, lowerCamelCase names, 64-bit integers as strings).
///
/// # Errors
/// The decode error, naming the message.
pub fn to_json(desc: &MessageDescriptor, bytes: &[u8]) -> Result<String, String> {
    let m = DynamicMessage::decode(desc.clone(), bytes)
        .map_err(|e| format!("the reply does not decode as {}: {e}", desc.full_name()))?;
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        serde_json::ser::PrettyFormatter::with_indent(b"  "),
    );
    m.serialize_with_options(&mut ser, &SerializeOptions::new())
        .map_err(|e| format!("{} as JSON: {e}", desc.full_name()))?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// The type of `field` as a .proto writes it: `int32`, `repeated string`,
/// `map<string, int64>`, `enum pkg.Kind`, `bytes (base64)`, `pkg.Message`.
pub fn type_name(field: &FieldDescriptor) -> String {
    if field.is_map() {
        if let Kind::Message(entry) = field.kind() {
            let k = entry.map_entry_key_field();
            let v = entry.map_entry_value_field();
            return format!("map<{}, {}>", kind_name(&k.kind()), kind_name(&v.kind()));
        }
    }
    if field.is_list() {
        format!("repeated {}", kind_name(&field.kind()))
    } else {
        kind_name(&field.kind())
    }
}

fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Double => "double".into(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes (base64)".into(),
        Kind::Enum(e) => format!("enum {}", e.full_name()),
        Kind::Message(m) => m.full_name().to_owned(),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Messages whose JSON form is not an object of their fields (the well-known types).
fn has_special_json(desc: &MessageDescriptor) -> bool {
    desc.full_name().starts_with("google.protobuf.")
}

/// Finds the first field of `value` that does not fit `desc`; `None` when each field fits on its
/// own (the error is then about the whole message, e.g. two members of one oneof).
fn diagnose(desc: &MessageDescriptor, value: &Value, path: &str) -> Option<String> {
    let Value::Object(map) = value else {
        return Some(format!(
            "{}: expected a JSON object for message {}, got {}",
            if path.is_empty() { "the request" } else { path },
            desc.full_name(),
            json_kind(value)
        ));
    };
    for (key, v) in map {
        let field_path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
        let Some(field) = desc.get_field_by_json_name(key).or_else(|| desc.get_field_by_name(key)) else {
            let names: Vec<String> = desc.fields().map(|f| f.json_name().to_owned()).collect();
            return Some(format!(
                "unknown field `{field_path}`: message {} has {}",
                desc.full_name(),
                if names.is_empty() {
                    "no fields".to_string()
                } else {
                    format!("fields {}", names.join(", "))
                }
            ));
        };
        let single = Value::Object(std::iter::once((key.clone(), v.clone())).collect());
        let Err(e) = DynamicMessage::deserialize(desc.clone(), &single) else { continue };
        // Look inside nested messages for the innermost culprit.
        if let Kind::Message(inner) = field.kind() {
            if !has_special_json(&inner) && !v.is_null() {
                let inner_err = if field.is_map() {
                    let vf = inner.map_entry_value_field();
                    match (vf.kind(), v) {
                        (Kind::Message(vm), Value::Object(entries)) if !has_special_json(&vm) => entries
                            .iter()
                            .find_map(|(k, ev)| diagnose(&vm, ev, &format!("{field_path}[{k:?}]"))),
                        _ => None,
                    }
                } else if field.is_list() {
                    match v {
                        Value::Array(items) => items
                            .iter()
                            .enumerate()
                            .find_map(|(i, item)| diagnose(&inner, item, &format!("{field_path}[{i}]"))),
                        _ => None,
                    }
                } else {
                    diagnose(&inner, v, &field_path)
                };
                if inner_err.is_some() {
                    return inner_err;
                }
            }
        }
        return Some(format!("field `{field_path}` ({}): {e}, got {}", type_name(&field), json_kind(v)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dynamic::schema::Schema;
    use std::path::PathBuf;

    fn schema(file: &str) -> Schema {
        let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../proto"));
        Schema::compile(&[dir.join(file)], &[dir]).unwrap()
    }

    /// JSON → protobuf → JSON gives the input back (in canonical form).
    fn round_trip(s: &Schema, msg: &str, json: &str) -> Value {
        let desc = s.message(msg).unwrap();
        let bytes = encode(&desc, &parse(json).unwrap()).unwrap();
        serde_json::from_str(&to_json(&desc, &bytes).unwrap()).unwrap()
    }

    #[test]
    fn scalars_enums_nested_repeated_maps_oneof() {
        let s = schema("codegen/shapes.proto");
        let json = r#"{"nickname":"r2","age":33,"name":"Artoo","kind":"KIND_ROBOT","phone":"5551234",
            "scores":{"a":"-7","b":"9000000000"},"addresses":[{"city":"Naboo"},{"city":"Hoth"}]}"#;
        assert_eq!(round_trip(&s, "codegen.shapes.Profile", json), parse(json).unwrap());
        // Input variants map to the same canonical JSON: proto names, numbers for 64-bit, enum numbers.
        let alt = r#"{"name":"Artoo","kind":2,"phone":5551234,"scores":{"a":-7}}"#;
        let v = round_trip(&s, "codegen.shapes.Profile", alt);
        assert_eq!(
            v,
            parse(r#"{"name":"Artoo","kind":"KIND_ROBOT","phone":"5551234","scores":{"a":"-7"}}"#).unwrap()
        );
        // The other oneof member, and proto3 `optional` set to its default value (kept: presence).
        let v = round_trip(&s, "codegen.shapes.Profile", r#"{"email":"a@b.c","age":0}"#);
        assert_eq!(v, parse(r#"{"email":"a@b.c","age":0}"#).unwrap());
        // Defaults are omitted.
        assert_eq!(
            round_trip(&s, "codegen.shapes.Profile", r#"{"name":"","kind":"KIND_UNSPECIFIED"}"#),
            parse("{}").unwrap()
        );
    }

    #[test]
    fn bytes_are_base64_and_encode_as_the_generated_message() {
        let s = schema("kv.proto");
        let desc = s.message("kv.PutRequest").unwrap();
        let bytes = encode(&desc, &parse(r#"{"key":"k1","value":"aGVsbG8="}"#).unwrap()).unwrap();
        // The same bytes prost's generated code writes: field 1 "k1", field 2 "hello".
        assert_eq!(&bytes[..], b"\x0a\x02k1\x12\x05hello");
        let v: Value = serde_json::from_str(&to_json(&desc, &bytes).unwrap()).unwrap();
        assert_eq!(v["value"], "aGVsbG8=");
        let bench = schema("bench.proto");
        let d = bench.message("rpcperf.EchoRequest").unwrap();
        let got = encode(&d, &parse(r#"{"payload":"AAEC","respSize":32}"#).unwrap()).unwrap();
        let want =
            crate::rpc::pb::EchoRequest { payload: vec![0u8, 1, 2].into(), resp_size: 32 }.encode_to_vec();
        assert_eq!(&got[..], &want[..]);
        // lowerCamelCase names on output (the proto3 JSON mapping), whatever the input used.
        let got = encode(&d, &parse(r#"{"resp_size":7}"#).unwrap()).unwrap();
        assert_eq!(to_json(&d, &got).unwrap(), "{\n  \"respSize\": 7\n}");
    }

    #[test]
    fn well_known_types() {
        let s = schema("codegen/well_known.proto");
        let json = r#"{"until":"2024-05-06T07:08:09.500Z","length":"90.250s"}"#;
        assert_eq!(round_trip(&s, "codegen.well_known.Lease", json), parse(json).unwrap());
        assert_eq!(
            round_trip(&s, "google.protobuf.Timestamp", r#""1970-01-01T00:00:01Z""#),
            parse(r#""1970-01-01T00:00:01Z""#).unwrap()
        );
        assert_eq!(round_trip(&s, "google.protobuf.Empty", "{}"), parse("{}").unwrap());
    }

    #[test]
    fn mismatches_name_the_field_and_its_type() {
        let s = schema("codegen/shapes.proto");
        let d = s.message("codegen.shapes.Profile").unwrap();
        let err = |json: &str| encode(&d, &parse(json).unwrap()).unwrap_err();
        let e = err(r#"{"age":"old"}"#);
        assert!(e.starts_with("field `age` (int32): "), "{e}");
        assert!(e.ends_with("got a string"), "{e}");
        let e = err(r#"{"nickname":"x","bogus":1}"#);
        assert_eq!(e, "unknown field `bogus`: message codegen.shapes.Profile has fields nickname, age, name, kind, email, phone, scores, addresses");
        let e = err(r#"{"addresses":[{"city":"a"},{"city":7}]}"#);
        assert!(e.starts_with("field `addresses[1].city` (string): "), "{e}");
        let e = err(r#"{"scores":{"a":"x"}}"#);
        assert!(e.starts_with("field `scores` (map<string, int64>): "), "{e}");
        let e = err(r#"{"kind":"KIND_ALIEN"}"#);
        assert!(e.starts_with("field `kind` (enum codegen.shapes.Profile.Kind): "), "{e}");
        let e = err(r#"{"addresses":[{"town":"a"}]}"#);
        assert!(
            e.starts_with("unknown field `addresses[0].town`: message codegen.shapes.Profile.Address"),
            "{e}"
        );
        let e = err("[1]");
        assert_eq!(e, "the request: expected a JSON object for message codegen.shapes.Profile, got an array");
        // Two members of one oneof: every field fits alone, the message does not.
        let e = err(r#"{"email":"a@b","phone":1}"#);
        assert!(e.starts_with("message codegen.shapes.Profile: "), "{e}");
        let kv = schema("kv.proto");
        let e = encode(&kv.message("kv.PutRequest").unwrap(), &parse(r#"{"value":"not base64!"}"#).unwrap())
            .unwrap_err();
        assert!(e.starts_with("field `value` (bytes (base64)): "), "{e}");
        let wk = schema("codegen/well_known.proto");
        let e =
            encode(&wk.message("codegen.well_known.Lease").unwrap(), &parse(r#"{"length":"soon"}"#).unwrap())
                .unwrap_err();
        assert!(e.starts_with("field `length` (google.protobuf.Duration): "), "{e}");
    }

    #[test]
    fn data_arguments_files_and_arrays() {
        let s = schema("kv.proto");
        let d = s.message("kv.GetRequest").unwrap();
        let dir = std::env::temp_dir().join(format!("rpc-perf-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("two.json");
        std::fs::write(&f, r#"[{"key":"a"},{"key":"b"}]"#).unwrap();
        let p = payloads(&d, &[format!("@{}", f.display()), r#"{"key":"c"}"#.into()]).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(&p[1].bytes[..], b"\x0a\x01b");
        assert_eq!(p[1].origin, format!("--data @{}[1]", f.display()));
        assert_eq!(p[2].origin, "--data #2");
        assert_eq!(payloads(&d, &[]).unwrap()[0].bytes.len(), 0);
        let e = payloads(&d, &[r#"{"key": }"#.into()]).unwrap_err().to_string();
        assert!(e.starts_with("--data: invalid JSON: "), "{e}");
        let e = payloads(&d, &[r#"{"key":1}"#.into()]).unwrap_err().to_string();
        assert!(e.starts_with("--data: field `key` (string): "), "{e}");
        let e = payloads(&d, &["@/nonexistent/x.json".into()]).unwrap_err().to_string();
        assert!(e.starts_with("--data @/nonexistent/x.json: "), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

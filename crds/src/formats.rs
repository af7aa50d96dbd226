//! The `format`s of the generated schema, narrowed to those Kubernetes knows.
//!
//! schemars names the Rust width of every number (`uint16`, `uint32`, `uint64`, `int8`, ...),
//! which the API server does not know: it warns `unrecognized format "uint32"` when the CRD is
//! applied and validates nothing with it. [`to_kubernetes`] rewrites each format to the one
//! Kubernetes uses for the same values (`int32`, `int64`, `float`, `double`) and drops any
//! other; an unsigned integer keeps (or gets) `minimum: 0`, which structural schemas allow, so
//! the sign bound the format stood for is still checked.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
    JSONSchemaPropsOrStringArray,
};

/// String formats the API server recognises in a CRD schema (`supportedVersionedFormats` of
/// apiextensions-apiserver; `date-time` is `datetime` with the dash, as go-openapi reads both).
pub const STRING_FORMATS: [&str; 27] = [
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "date-time",
    "k8s-short-name",
    "k8s-long-name",
];

/// Whether Kubernetes knows `format` on a node of OpenAPI type `type_`: `int32` and `int64`
/// on integers and `float` and `double` on numbers (the formats of Kubernetes' own APIs), or
/// one of [`STRING_FORMATS`] on strings.
pub fn is_known(type_: Option<&str>, format: &str) -> bool {
    match type_ {
        Some("integer") => matches!(format, "int32" | "int64"),
        Some("number") => matches!(format, "float" | "double"),
        Some("string") => STRING_FORMATS.contains(&format),
        _ => false,
    }
}

/// The format Kubernetes uses for the values schemars' `format` stands for on a node of type
/// `type_`, `None` when it has none.
fn kubernetes_format(type_: Option<&str>, format: &str) -> Option<&'static str> {
    match (type_, format) {
        // 32 bits hold every value of the narrower widths
        (Some("integer"), "int8" | "int16" | "int32" | "uint8" | "uint16") => Some("int32"),
        // an unsigned 32-bit value can exceed i32; int64 is Kubernetes' widest integer
        (
            Some("integer"),
            "uint32" | "int64" | "uint64" | "int" | "uint" | "int128" | "uint128",
        ) => Some("int64"),
        (Some("number"), "float") => Some("float"),
        (Some("number"), "double") => Some("double"),
        (Some("string"), f) => STRING_FORMATS.iter().find(|known| **known == f).copied(),
        _ => None,
    }
}

/// Rewrites every format of `crd`'s schemas to one Kubernetes knows (see the module doc).
pub fn to_kubernetes(crd: &mut CustomResourceDefinition) {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            rewrite(schema);
        }
    }
}

fn rewrite(node: &mut JSONSchemaProps) {
    if let Some(format) = node.format.take() {
        if format.starts_with("uint") && node.minimum.is_none() {
            node.minimum = Some(0.0);
        }
        node.format = kubernetes_format(node.type_.as_deref(), &format).map(str::to_string);
    }
    for child in children(node) {
        rewrite(child);
    }
}

/// Every schema nested directly in `node`.
pub(crate) fn children(node: &mut JSONSchemaProps) -> Vec<&mut JSONSchemaProps> {
    let mut out: Vec<&mut JSONSchemaProps> = Vec::new();
    let JSONSchemaProps {
        additional_items,
        additional_properties,
        all_of,
        any_of,
        one_of,
        not,
        definitions,
        dependencies,
        items,
        pattern_properties,
        properties,
        ..
    } = node;
    for or_bool in [additional_items, additional_properties]
        .into_iter()
        .flatten()
    {
        if let JSONSchemaPropsOrBool::Schema(s) = or_bool {
            out.push(s);
        }
    }
    for list in [all_of, any_of, one_of].into_iter().flatten() {
        out.extend(list.iter_mut());
    }
    if let Some(n) = not {
        out.push(n);
    }
    for map in [definitions, pattern_properties, properties]
        .into_iter()
        .flatten()
    {
        out.extend(map.values_mut());
    }
    for d in dependencies.iter_mut().flat_map(|m| m.values_mut()) {
        if let JSONSchemaPropsOrStringArray::Schema(s) = d {
            out.push(s);
        }
    }
    match items {
        Some(JSONSchemaPropsOrArray::Schema(s)) => out.push(s),
        Some(JSONSchemaPropsOrArray::Schemas(list)) => out.extend(list.iter_mut()),
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(type_: &str, format: &str) -> JSONSchemaProps {
        JSONSchemaProps {
            type_: Some(type_.into()),
            format: Some(format.into()),
            ..JSONSchemaProps::default()
        }
    }

    fn rewritten(mut n: JSONSchemaProps) -> JSONSchemaProps {
        rewrite(&mut n);
        n
    }

    #[test]
    fn widths_become_kubernetes_formats() {
        for (from, to) in [
            ("uint8", "int32"),
            ("uint16", "int32"),
            ("int16", "int32"),
            ("int32", "int32"),
            ("uint32", "int64"),
            ("uint64", "int64"),
            ("int64", "int64"),
        ] {
            assert_eq!(
                rewritten(node("integer", from)).format.as_deref(),
                Some(to),
                "{from}"
            );
        }
        assert_eq!(
            rewritten(node("number", "double")).format.as_deref(),
            Some("double")
        );
        assert_eq!(
            rewritten(node("string", "date-time")).format.as_deref(),
            Some("date-time")
        );
        assert_eq!(rewritten(node("string", "uint32")).format, None);
        assert_eq!(rewritten(node("string", "regex")).format, None);
    }

    #[test]
    fn unsigned_keeps_its_sign_bound() {
        assert_eq!(rewritten(node("integer", "uint32")).minimum, Some(0.0));
        let bounded = JSONSchemaProps {
            minimum: Some(1.0),
            ..node("integer", "uint16")
        };
        assert_eq!(rewritten(bounded).minimum, Some(1.0));
        assert_eq!(rewritten(node("integer", "int64")).minimum, None);
    }

    #[test]
    fn nested_schemas_are_rewritten() {
        let mut root = JSONSchemaProps {
            type_: Some("object".into()),
            properties: Some(
                [(
                    "list".to_string(),
                    JSONSchemaProps {
                        type_: Some("array".into()),
                        items: Some(JSONSchemaPropsOrArray::Schema(Box::new(node(
                            "integer", "uint64",
                        )))),
                        ..JSONSchemaProps::default()
                    },
                )]
                .into(),
            ),
            additional_properties: Some(JSONSchemaPropsOrBool::Schema(Box::new(node(
                "number", "float32",
            )))),
            ..JSONSchemaProps::default()
        };
        rewrite(&mut root);
        let list = &root.properties.as_ref().unwrap()["list"];
        let Some(JSONSchemaPropsOrArray::Schema(item)) = &list.items else {
            panic!("items lost")
        };
        assert_eq!(item.format.as_deref(), Some("int64"));
        let Some(JSONSchemaPropsOrBool::Schema(extra)) = &root.additional_properties else {
            panic!("additionalProperties lost")
        };
        assert_eq!(extra.format, None);
    }
}

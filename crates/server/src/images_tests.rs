use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::*;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR tail";
const JPEG: &[u8] = &[0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3];
const GIF: &[u8] = b"GIF89a rest";
const WEBP: &[u8] = b"RIFF\x10\0\0\0WEBPVP8 ";

fn accepting() -> Images {
    Images::new(ImageLimits::default(), true)
}

fn url(media: &str, bytes: &[u8]) -> String {
    format!("data:{media};base64,{}", STANDARD.encode(bytes))
}

fn error(r: Result<(), ApiError>) -> (String, Option<String>, Option<&'static str>) {
    let e = r.expect_err("refused");
    assert_eq!(e.status.as_u16(), 400, "{}", e.message);
    (e.message, e.param, e.code)
}

#[test]
fn data_urls_of_each_type_are_accepted_in_order() {
    let mut images = Images::new(ImageLimits::default(), true);
    for (media, bytes) in [
        ("image/png", PNG),
        ("image/jpeg", JPEG),
        ("IMAGE/JPG", JPEG),
        ("image/gif", GIF),
        ("image/webp", WEBP),
    ] {
        images
            .push_url("messages[0].content[1]", &url(media, bytes))
            .unwrap();
    }
    let types: Vec<_> = images.list.iter().map(|i| i.media_type).collect();
    assert_eq!(
        types,
        [
            "image/png",
            "image/jpeg",
            "image/jpeg",
            "image/gif",
            "image/webp"
        ]
    );
    assert_eq!(&*images.list[0].bytes, PNG);
    let want: [u8; 32] = Sha256::digest(PNG).into();
    assert_eq!(images.list[0].sha256, want);
    // Extra parameters in the data URL are allowed.
    images
        .push_url(
            "f",
            &format!("data:image/png;name=x.png;base64,{}", STANDARD.encode(PNG)),
        )
        .unwrap();
}

#[test]
fn remote_urls_are_refused_because_nothing_is_fetched() {
    for u in [
        "http://example.com/a.png",
        "https://example.com/a.png",
        "HTTPS://X/a.png",
    ] {
        let (message, param, code) = error(accepting().push_url("messages[0].content[0]", u));
        assert!(message.contains("no outbound requests"), "{message}");
        assert_eq!(param.as_deref(), Some("messages[0].content[0]"));
        assert_eq!(code, Some("unsupported_image_source"));
    }
    let (message, ..) = error(accepting().push_url("f", "ftp://x/a.png"));
    assert!(message.contains("expected a data URL"), "{message}");
}

#[test]
fn malformed_images_say_why() {
    let cases = [
        ("data:image/png,abc".to_string(), "must be base64-encoded"),
        ("data:image/png;base64,!!!!".to_string(), "not valid base64"),
        (
            url("image/bmp", b"BM...."),
            "media type \"image/bmp\" is not accepted",
        ),
        (url("image/png", JPEG), "not a image/png image"),
        (url("image/png", &PNG[..4]), "not a image/png image"),
        (url("image/gif", b""), "not a image/gif image"),
        ("data:image/png;base64".to_string(), "expected a data URL"),
    ];
    for (u, want) in cases {
        let (message, param, _) = error(accepting().push_url("input[0].content[2]", &u));
        assert!(message.contains(want), "{u}: {message}");
        assert_eq!(param.as_deref(), Some("input[0].content[2]"));
    }
}

#[test]
fn limits_name_the_flag() {
    let mut images = Images::new(
        ImageLimits {
            max_images: 2,
            max_image_bytes: 32,
        },
        true,
    );
    images.push_url("a", &url("image/png", PNG)).unwrap();
    images.push_url("b", &url("image/gif", GIF)).unwrap();
    let (message, _, code) = error(images.push_url("c", &url("image/gif", GIF)));
    assert!(
        message.contains("more than 2 images") && message.contains("--max-images"),
        "{message}"
    );
    assert_eq!(code, Some("image_limit_exceeded"));

    let mut images = Images::new(
        ImageLimits {
            max_images: 2,
            max_image_bytes: 32,
        },
        true,
    );
    let mut big = PNG.to_vec();
    big.resize(33, 0);
    let (message, ..) = error(images.push_url("d", &url("image/png", &big)));
    assert!(
        message.contains("33 bytes") && message.contains("--max-image-bytes of 32"),
        "{message}"
    );
    // Far over the limit: refused from the encoded length, before decoding.
    big.resize(4096, 0);
    let (message, ..) = error(images.push_url("d", &url("image/png", &big)));
    assert!(message.contains("--max-image-bytes"), "{message}");
    big.truncate(32);
    images.push_url("d", &url("image/png", &big)).unwrap();
}

#[test]
fn anthropic_sources() {
    let mut images = accepting();
    let ok = json!({"type": "base64", "media_type": "image/jpeg", "data": STANDARD.encode(JPEG)});
    images
        .push_anthropic("messages[0].content[0]", Some(&ok))
        .unwrap();
    assert_eq!(images.list[0].media_type, "image/jpeg");

    let remote = json!({"type": "url", "url": "https://example.com/cat.png"});
    let (message, param, _) = error(images.push_anthropic("messages[0].content[1]", Some(&remote)));
    assert!(message.contains("no outbound requests"), "{message}");
    assert_eq!(param.as_deref(), Some("messages[0].content[1].source"));

    let (message, ..) = error(images.push_anthropic("m", None));
    assert!(message.contains("m.source is required"), "{message}");
    let file = json!({"type": "file", "file_id": "f_1"});
    let (message, ..) = error(images.push_anthropic("m", Some(&file)));
    assert!(message.contains("only \"base64\""), "{message}");
    let no_data = json!({"type": "base64", "media_type": "image/png"});
    let (message, param, _) = error(images.push_anthropic("m", Some(&no_data)));
    assert!(message.contains("m.source.data is required"), "{message}");
    assert_eq!(param.as_deref(), Some("m.source.data"));
    let wrong = json!({"type": "base64", "media_type": "image/png", "data": STANDARD.encode(GIF)});
    let (message, ..) = error(images.push_anthropic("m", Some(&wrong)));
    assert!(message.contains("not a image/png image"), "{message}");
}

#[test]
fn a_model_without_images_refuses_any_image_part_unread() {
    let mut images = Images::new(ImageLimits::default(), false);
    for r in [
        images.push_url("messages[0].content[1]", "https://example.com/a.png"),
        images.push_image_url("messages[0].content[1]", None),
        images.push_anthropic("messages[0].content[1]", None),
    ] {
        let (message, param, code) = error(r);
        assert!(
            message.contains("images are not supported by this model"),
            "{message}"
        );
        assert_eq!(param.as_deref(), Some("messages[0].content[1]"));
        assert_eq!(code, Some("unsupported_content"));
    }
    assert!(images.list.is_empty());
}

//! Wire protocol: round trips of every message, forward compatibility, typed rejection of bad
//! input, and a decoder that never panics on arbitrary bytes.

mod common;

// The same tests run in the browser (wasm-bindgen-test), at the default, reduced sizes.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use common::*;
use hostlease::protocol::codec::{
    decode_body, decode_payload, encode_body, signing_bytes, MAX_CLIENT_FRAME, MAX_CLIENT_PAYLOAD,
    MAX_MEMBERS, MAX_PAYLOAD_DEPTH, MAX_SERVER_FRAME,
};
use hostlease::protocol::*;
use proptest::prelude::*;
use serde_json::json;

fn server_messages() -> Vec<ServerMsg> {
    let a = assignment(3, 7, Some("a"));
    let signed = SignedAssignment {
        assignment: a.clone(),
        kid: Some(KeyId::new("k1").unwrap()),
        sig: Some("c2lnbmF0dXJl".into()),
    };
    vec![
        welcome(
            "a",
            snapshot(a.clone(), vec![member("a", 1)], Some(2500)),
            vec![
                Item::Assignment(assignment(2, 5, Some("b")).into()),
                Item::Event(event(6, 2, "b")),
            ],
        ),
        ServerMsg::Welcome {
            you: pid("b"),
            session: sid("b-s"),
            snapshot: snapshot(assignment(1, 1, None), vec![], None),
            missed: vec![],
            discontinuity: Some(Gap {
                from: Seq(2),
                to: Seq(9),
            }),
        },
        ServerMsg::Assignment(signed.clone()),
        ServerMsg::Assignment(assignment(4, 8, None).into()),
        ServerMsg::Event(event(9, 3, "c")),
        ServerMsg::LeaseProbe {
            nonce: 42,
            epoch: Epoch(3),
        },
        ServerMsg::LeaseConfirm {
            nonce: 42,
            epoch: Epoch(3),
            remaining_ms: 2900,
        },
        host_cap(3),
        participant_cap(),
        ServerMsg::Presence {
            member: member("d", 4),
            online: true,
        },
        ServerMsg::Presence {
            member: member("d", 4),
            online: false,
        },
        ServerMsg::PresenceBatch {
            joined: vec![member("e", 5), member("f", 6)],
            left: vec![member("d", 4)],
        },
        ServerMsg::CommandResult {
            id: IdempotencyKey::new("k-1").unwrap(),
            outcome: Outcome::Accepted { seq: Seq(10) },
        },
        ServerMsg::CommandResult {
            id: IdempotencyKey::new("k-2").unwrap(),
            outcome: Outcome::Rejected {
                code: RejectCode::StaleEpoch,
                current: Some(signed),
                retry_after_ms: None,
            },
        },
        ServerMsg::CommandResult {
            id: IdempotencyKey::new("k-3").unwrap(),
            outcome: Outcome::Rejected {
                code: RejectCode::RateLimited,
                current: None,
                retry_after_ms: Some(1000),
            },
        },
        ServerMsg::Discontinuity(Gap {
            from: Seq(3),
            to: Seq(4),
        }),
        ServerMsg::Signal {
            from: pid("a"),
            from_session: sid("a-s"),
            data: js(json!({"sdp": "v=0", "type": "offer"})),
        },
        ServerMsg::Error {
            code: ErrorCode::RateLimited,
            message: "slow down".into(),
        },
        ServerMsg::Heartbeat,
    ]
}

fn client_messages() -> Vec<ClientMsg> {
    vec![
        ClientMsg::Hello {
            token: Token::new("jt"),
            resume: Some(Seq(4)),
            epoch_seen: Some(Epoch(2)),
        },
        ClientMsg::Hello {
            token: Token::new("jt"),
            resume: None,
            epoch_seen: None,
        },
        ClientMsg::Resume { cursor: Seq(12) },
        ClientMsg::LeaseEcho { nonce: 7 },
        ClientMsg::Leave,
        ClientMsg::Command {
            id: IdempotencyKey::new("abc").unwrap(),
            action: action("poll.open"),
            payload: js(json!({"question": "Lunch?", "options": ["pizza", "soup"]})),
            epoch: Some(Epoch(3)),
            capability: Token::new("cap"),
            after: None,
        },
        ClientMsg::Command {
            id: IdempotencyKey::new("abd").unwrap(),
            action: action("vote"),
            payload: js(json!(1)),
            epoch: None,
            capability: Token::new("cap"),
            after: Some(IdempotencyKey::new("abc").unwrap()),
        },
        ClientMsg::Signal {
            to: pid("b"),
            to_session: Some(sid("b-s")),
            data: js(json!({"ice": "x"})),
        },
    ]
}

#[test]
fn every_server_message_round_trips() {
    for m in server_messages() {
        let text = encode_server(&m);
        assert!(text.starts_with("{\"v\":1,"), "{text}");
        // The JS wrapper takes event frames on its fast path by this head (pkg/index.js).
        let event_head = "{\"v\":1,\"t\":\"event\",";
        assert_eq!(
            text.starts_with(event_head),
            matches!(m, ServerMsg::Event(_)),
            "{text}"
        );
        assert_eq!(decode_server(&text).unwrap(), m, "{text}");
    }
}

#[test]
fn every_client_message_round_trips() {
    for m in client_messages() {
        let text = encode_client(&m);
        assert_eq!(decode_client(&text).unwrap(), m, "{text}");
    }
}

#[test]
fn http_bodies_round_trip() {
    let snap = snapshot(assignment(2, 4, Some("a")), vec![member("a", 1)], None);
    let text = encode_body(&snap);
    assert_eq!(
        decode_body::<Snapshot>(&text, MAX_SERVER_FRAME).unwrap(),
        snap
    );

    let req = CommandRequest {
        action: action("vote"),
        payload: js(json!({"o": 1})),
        epoch: None,
    };
    let text = encode_body(&req);
    assert_eq!(
        decode_body::<CommandRequest>(&text, MAX_CLIENT_FRAME).unwrap(),
        req
    );

    for outcome in [
        Outcome::Accepted { seq: Seq(3) },
        Outcome::Rejected {
            code: RejectCode::NotHost,
            current: None,
            retry_after_ms: None,
        },
    ] {
        let text = encode_body(&outcome);
        assert_eq!(
            decode_body::<Outcome>(&text, MAX_CLIENT_FRAME).unwrap(),
            outcome
        );
    }

    let page = InboxPage {
        entries: vec![InboxEntry {
            cursor: 1,
            item: Item::Event(event(3, 1, "a")),
        }],
        next: Some(2),
    };
    let text = encode_body(&page);
    assert_eq!(
        decode_body::<InboxPage>(&text, MAX_SERVER_FRAME).unwrap(),
        page
    );

    let keys = KeySet {
        keys: vec![PublicKey {
            kid: KeyId::new("k1").unwrap(),
            alg: "Ed25519".into(),
            x: "AAAA".into(),
        }],
    };
    let text = encode_body(&keys);
    assert_eq!(
        decode_body::<KeySet>(&text, MAX_SERVER_FRAME).unwrap(),
        keys
    );
}

#[test]
fn unknown_fields_are_ignored() {
    let text = r#"{"v":1,"t":"lease_probe","nonce":5,"epoch":2,"future":{"x":[1,2]},"zz":null}"#;
    assert_eq!(
        decode_server(text).unwrap(),
        ServerMsg::LeaseProbe {
            nonce: 5,
            epoch: Epoch(2)
        }
    );
    let text = r#"{"v":1,"t":"assignment","room":"room-1","host":null,"session":null,"epoch":3,
        "seq":4,"lease_ms":1,"reason":"some_new_reason","issued_at":0,"shard":"x"}"#;
    match decode_server(text).unwrap() {
        ServerMsg::Assignment(a) => assert_eq!(a.assignment.reason, Reason::Unknown),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_major_version_is_a_typed_error() {
    let text = r#"{"v":2,"t":"lease_probe","nonce":5,"epoch":2,"new_shape":true}"#;
    assert_eq!(decode_server(text), Err(DecodeError::UnsupportedVersion(2)));
    assert_eq!(
        decode_client(r#"{"v":9,"t":"leave"}"#),
        Err(DecodeError::UnsupportedVersion(9))
    );
    assert_eq!(
        decode_server(r#"{"t":"leave"}"#),
        Err(DecodeError::MissingVersion)
    );
    assert_eq!(
        decode_server(r#"{"v":1,"t":"hologram"}"#),
        Err(DecodeError::UnknownType)
    );
    // A client message type is not a server message.
    assert_eq!(
        decode_server(r#"{"v":1,"t":"hello","token":"x"}"#),
        Err(DecodeError::UnknownType)
    );
}

#[test]
fn malformed_and_oversized_input_is_rejected_with_typed_errors() {
    for bad in [
        "",
        "{",
        "[]",
        "null",
        "{\"v\":\"one\"}",
        "{\"v\":1,\"t\":\"lease_probe\"}",
        r#"{"v":1,"t":"lease_probe","nonce":-1,"epoch":2}"#,
    ] {
        let err = decode_server(bad).unwrap_err();
        assert!(
            matches!(err, DecodeError::Malformed { .. }),
            "{bad:?} gave {err:?}"
        );
    }
    let huge = format!(
        r#"{{"v":1,"t":"resume","cursor":1,"pad":"{}"}}"#,
        "x".repeat(MAX_CLIENT_FRAME)
    );
    assert!(matches!(
        decode_client(&huge),
        Err(DecodeError::TooLarge { .. })
    ));
    let huge = "x".repeat(MAX_SERVER_FRAME + 1);
    assert!(matches!(
        decode_server(&huge),
        Err(DecodeError::TooLarge { .. })
    ));
}

/// A payload the SDK lets through (`MAX_CLIENT_PAYLOAD`) always makes a frame within the
/// server's limit, whatever else the frame carries at its longest.
#[test]
fn the_largest_payload_fits_a_frame_with_the_longest_everything_else() {
    let longest = |c: char| c.to_string().repeat(128);
    // A JSON string of exactly MAX_CLIENT_PAYLOAD bytes, escapes included.
    let body = format!("\"{}\"", "\\n".repeat((MAX_CLIENT_PAYLOAD - 2) / 2));
    assert_eq!(body.len(), MAX_CLIENT_PAYLOAD);
    let payload = decode_payload(&body).unwrap();
    for msg in [
        ClientMsg::Command {
            id: IdempotencyKey::new(longest('k')).unwrap(),
            action: Action::new(longest('a')).unwrap(),
            payload: payload.clone(),
            epoch: Some(Epoch(u64::MAX)),
            capability: Token::new("t".repeat(MAX_TOKEN_LEN)),
            after: Some(IdempotencyKey::new(longest('k')).unwrap()),
        },
        ClientMsg::Signal {
            to: ParticipantId::new(longest('p')).unwrap(),
            to_session: Some(SessionId::new(longest('s')).unwrap()),
            data: payload.clone(),
        },
    ] {
        let frame = encode_client(&msg);
        assert!(frame.len() <= MAX_CLIENT_FRAME, "{} bytes", frame.len());
        assert_eq!(decode_client(&frame).unwrap(), msg);
    }
    // One byte more is refused before it reaches a frame.
    let over = format!("\"{}\"", "x".repeat(MAX_CLIENT_PAYLOAD - 1));
    assert!(matches!(
        decode_payload(&over),
        Err(DecodeError::TooLarge { .. })
    ));
}

/// A payload the SDK lets through (`MAX_PAYLOAD_DEPTH`) nests shallowly enough for every frame
/// that carries it to be read: the client's command and signal, and the server's deepest (an
/// inbox page). One level deeper is refused before it reaches a frame: the reader gave a
/// depth-128 payload a pass, and its frame (129) closed the connection at the server.
#[test]
fn the_deepest_payload_fits_every_frame_that_carries_it() {
    let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
    let payload = decode_payload(&deep(MAX_PAYLOAD_DEPTH)).unwrap();
    assert_eq!(payload.depth(), MAX_PAYLOAD_DEPTH);
    let command = ClientMsg::Command {
        id: IdempotencyKey::new("k").unwrap(),
        action: Action::new("vote").unwrap(),
        payload: payload.clone(),
        epoch: None,
        capability: Token::new("t"),
        after: None,
    };
    let signal = ClientMsg::Signal {
        to: ParticipantId::new("p").unwrap(),
        to_session: None,
        data: payload.clone(),
    };
    for msg in [command, signal] {
        assert_eq!(decode_client(&encode_client(&msg)).unwrap(), msg);
    }
    let page = InboxPage {
        entries: vec![InboxEntry {
            cursor: 1,
            item: Item::Event(RoomEvent {
                seq: Seq(1),
                epoch: Epoch(1),
                actor: ParticipantId::new("p").unwrap(),
                action: Action::new("vote").unwrap(),
                payload,
                at: ServerTime(0),
            }),
        }],
        next: None,
    };
    let text = encode_body(&page);
    assert_eq!(decode_body::<InboxPage>(&text, usize::MAX).unwrap(), page);
    for over in [MAX_PAYLOAD_DEPTH + 1, json::MAX_DEPTH as usize] {
        assert!(
            matches!(
                decode_payload(&deep(over)),
                Err(DecodeError::Malformed { .. })
            ),
            "{over}"
        );
    }
    // Anything else the reader takes, it still takes.
    assert!(decode_payload("{\"a\": [1, {\"b\": null}]}").is_ok());
}

#[test]
fn identifiers_are_validated_on_decode() {
    for bad_room in ["", "has space", "new\nline", &"r".repeat(129), ".", ".."] {
        let text =
            serde_json::json!({"v":1,"t":"assignment","room":bad_room,"host":null,"session":null,
            "epoch":1,"seq":1,"lease_ms":1,"reason":"elected","issued_at":0})
            .to_string();
        assert!(
            matches!(decode_server(&text), Err(DecodeError::Malformed { .. })),
            "{bad_room:?}"
        );
    }
    assert_eq!(
        ParticipantId::new("a b").unwrap_err().code(),
        "id_bad_character"
    );
    // `.` and `..` would vanish from a URL path (`/v1/rooms/../ws`); other dotted names are fine.
    assert_eq!(RoomId::new("..").unwrap_err().code(), "id_dots");
    for fine in ["...", ".a", "a.", "a..b"] {
        RoomId::new(fine).unwrap();
    }
}

#[test]
fn protocol_rules_beyond_shape_are_enforced() {
    // Host without session.
    let text = r#"{"v":1,"t":"assignment","room":"room-1","host":"a","session":null,"epoch":1,
        "seq":1,"lease_ms":1,"reason":"elected","issued_at":0}"#;
    assert!(matches!(decode_server(text), Err(DecodeError::Invalid(_))));
    // Too many members.
    let mut snap = snapshot(assignment(1, 1, None), vec![], None);
    snap.members = (0..=MAX_MEMBERS as u64)
        .map(|i| member(&format!("m{i}"), i))
        .collect();
    let text = encode_server(&welcome("a", snap, vec![]));
    assert!(matches!(
        decode_server(&text),
        Err(DecodeError::Invalid("too many members"))
    ));
    // A replayed item past the snapshot point: a view would hold it outside its buffer's bound
    // and ask for another resume, whose welcome could add as many again.
    let past = welcome(
        "a",
        snapshot(assignment(1, 5, None), vec![], None),
        vec![Item::Event(event(5, 1, "b")), Item::Event(event(6, 1, "b"))],
    );
    assert_eq!(
        decode_server(&encode_server(&past)),
        Err(DecodeError::Invalid("replay out of bounds"))
    );
    // Snapshot whose assignment is for another room.
    let mut snap = snapshot(assignment(1, 1, None), vec![], None);
    snap.current.assignment.room = RoomId::new("other").unwrap();
    let text = encode_server(&welcome("a", snap, vec![]));
    assert!(matches!(decode_server(&text), Err(DecodeError::Invalid(_))));
    // Reversed discontinuity, alone or in a welcome.
    let text = r#"{"v":1,"t":"discontinuity","from":5,"to":4}"#;
    assert!(matches!(decode_server(text), Err(DecodeError::Invalid(_))));
    let mut reversed = welcome("a", snapshot(assignment(1, 9, None), vec![], None), vec![]);
    let ServerMsg::Welcome { discontinuity, .. } = &mut reversed else {
        unreachable!()
    };
    *discontinuity = Some(Gap {
        from: Seq(5),
        to: Seq(4),
    });
    assert!(matches!(
        decode_server(&encode_server(&reversed)),
        Err(DecodeError::Invalid("discontinuity range is reversed"))
    ));
    // Over-long display name.
    let mut m = member("a", 1);
    m.name = "n".repeat(65);
    let text = encode_server(&ServerMsg::Presence {
        member: m,
        online: true,
    });
    assert!(matches!(decode_server(&text), Err(DecodeError::Invalid(_))));
    // An over-long signature, on an assignment or on a rejection's (adopted and relayed to
    // peers like any other: it was not checked there).
    let mut long: SignedAssignment = assignment(2, 2, Some("a")).into();
    long.sig = Some("s".repeat(codec::MAX_SIG_LEN + 1));
    for msg in [
        ServerMsg::Assignment(long.clone()),
        ServerMsg::CommandResult {
            id: IdempotencyKey::new("k").unwrap(),
            outcome: Outcome::Rejected {
                code: RejectCode::StaleEpoch,
                current: Some(long),
                retry_after_ms: None,
            },
        },
    ] {
        assert!(matches!(
            decode_server(&encode_server(&msg)),
            Err(DecodeError::Invalid("signature too long"))
        ));
    }
}

#[test]
fn tokens_never_appear_in_debug_or_errors() {
    let secret = "tok-SECRET-123";
    let hello = ClientMsg::Hello {
        token: Token::new(secret),
        resume: None,
        epoch_seen: None,
    };
    assert!(!format!("{hello:?}").contains(secret));
    assert!(!format!("{}", Token::new(secret)).contains(secret));
    // A malformed frame carrying a token: the error must not echo it.
    let bad = format!(r#"{{"v":1,"t":"hello","token":"{secret}","resume":"{secret}"}}"#);
    let err = decode_client(&bad).unwrap_err();
    assert!(!format!("{err} {err:?}").contains(secret), "{err}");
    // And the encoded frame does carry it (tokens travel in frames, not URLs).
    assert!(encode_client(&hello).contains(secret));
}

#[test]
fn signing_bytes_are_exact() {
    let a = assignment(3, 7, Some("a"));
    assert_eq!(
        String::from_utf8(signing_bytes(&a)).unwrap(),
        "hostlease/v1/assignment\nroom-1\na\na-s\n3\n7\n3000\nelected\n1700000000007"
    );
    let hostless = assignment(4, 8, None);
    assert_eq!(
        String::from_utf8(signing_bytes(&hostless)).unwrap(),
        "hostlease/v1/assignment\nroom-1\n\n\n4\n8\n3000\nelected\n1700000000008"
    );
}

fn is_out_of_range(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("number out of range")
}

/// Payloads are checked for grammar only and passed on as text: a number beyond what an `f64`
/// holds is well formed (RFC 8259 leaves the range to implementations), where serde_json's
/// `Value` refuses it. The server hashes such a payload as its text (`request_hash`).
#[test]
fn numbers_beyond_f64_are_grammar() {
    for text in ["[2e901]", "1e400", "-1E+309", "{\"x\":[0.5e999]}"] {
        assert_eq!(Json::parse(text).unwrap().as_str(), text);
        assert!(
            is_out_of_range(&serde_json::from_str::<serde_json::Value>(text).unwrap_err()),
            "{text}"
        );
    }
    assert!(Json::parse("[2e901,,]").is_err());
}

/// JSON leaves, valid and not, for texts at the edge of the grammar.
const LEAVES: &[&str] = &[
    "\"a\"",
    "\"\"",
    "\"\\u00e9\"",
    "\"\\ud83d\\ude00\"",
    "\"\\ud800\"",
    "\"\\udc00x\"",
    "\"\\ud800\\u0041\"",
    "\"\\x\"",
    "\"\\n\\/\\b\"",
    "\"é😀\"",
    "\"\t\"",
    "\"\u{7f}\"",
    "\"",
    "\"\\u12\"",
    "0",
    "-0",
    "01",
    "-01",
    "12",
    "-",
    "1.5",
    "1.",
    ".5",
    "2e9",
    "1E-3",
    "1e+",
    "-1.0e-0",
    "18446744073709551616",
    "true",
    "false",
    "null",
    "nul",
    "tru",
    "x",
    "NaN",
    " 7 ",
    "\n",
    "",
];

/// Arrays and objects of [`LEAVES`], mostly well formed: separators are sometimes doubled,
/// missing or trailing.
fn near_json() -> impl Strategy<Value = String> {
    let leaf = (0..LEAVES.len()).prop_map(|i| LEAVES[i].to_string());
    let sep = prop_oneof![8 => Just(","), 1 => Just(",,"), 1 => Just(""), 1 => Just(" , ")];
    leaf.prop_recursive(4, 32, 4, move |inner| {
        let entries = prop::collection::vec((inner, sep.clone(), any::<bool>()), 0..4);
        (entries, any::<bool>(), 0..4u8).prop_map(|(entries, object, close)| {
            let mut out = String::from(if object { "{" } else { "[" });
            for (i, (value, sep, colon)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                if object {
                    out.push_str(if *colon { "\"k\":" } else { "\"k\"" });
                }
                out.push_str(value);
            }
            if close > 0 {
                out.push_str(if object { "}" } else { "]" });
            }
            out
        })
    })
}

proptest! {
    #![proptest_config(props())]

    /// `Json::parse` accepts exactly the texts serde_json accepts, among texts whose numbers fit
    /// an `f64`. Leaves joined without a separator can make a number that does not (`2e9` `01`
    /// is `2e901`); serde_json refuses it as out of range while the grammar allows it (see
    /// `numbers_beyond_f64_are_grammar`), so such texts are outside this property.
    #[test]
    fn payload_grammar_matches_serde_json(text in near_json()) {
        let theirs = serde_json::from_str::<serde_json::Value>(&text);
        prop_assume!(!theirs.as_ref().is_err_and(is_out_of_range));
        prop_assert_eq!(Json::parse(&text).is_ok(), theirs.is_ok(), "{:?}", text);
    }

    /// Strings are written byte for byte as serde_json writes them, and read back.
    #[test]
    fn strings_are_escaped_as_serde_json_does(s in "\\PC{0,40}|[\\x00-\\x20\"\\\\/]{0,10}") {
        let id = Member { name: s.clone(), ..member("a", 1) };
        let text = encode_body(&id);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(v["name"].as_str(), Some(s.as_str()));
        prop_assert_eq!(&text[text.find("\"name\":").unwrap() + 7..text.find(",\"join_seq\"").unwrap()],
            serde_json::to_string(&s).unwrap());
        prop_assert_eq!(decode_body::<Member>(&text, MAX_SERVER_FRAME).unwrap().name, s);
    }

    /// The decoders never panic on arbitrary text.
    #[test]
    fn decoders_never_panic_on_arbitrary_text(s in "\\PC{0,300}") {
        let _ = decode_server(&s);
        let _ = decode_client(&s);
    }

    /// Nor on valid frames with a byte mutated, truncated or spliced.
    #[test]
    fn decoders_never_panic_on_mutated_frames(
        which in 0usize..25, pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<bool>()
    ) {
        let frames: Vec<String> = server_messages().iter().map(encode_server)
            .chain(client_messages().iter().map(encode_client)).collect();
        let mut bytes = frames[which % frames.len()].clone().into_bytes();
        let i = pos.index(bytes.len());
        if cut { bytes.truncate(i) } else { bytes[i] = byte }
        if let Ok(text) = String::from_utf8(bytes) {
            let _ = decode_server(&text);
            let _ = decode_client(&text);
        }
    }
}

/// The keys of a flat JSON object, in every rotation and reversed: enough orders to put any key
/// (the tag in particular) first, last and in between.
fn key_orders(text: &str) -> Vec<String> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(text) else {
        panic!("not an object: {text}")
    };
    let entries: Vec<String> = map.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
    let mut orders = Vec::new();
    for r in 0..entries.len() {
        let mut e = entries.clone();
        e.rotate_left(r);
        orders.push(format!("{{{}}}", e.join(",")));
        e.reverse();
        orders.push(format!("{{{}}}", e.join(",")));
    }
    orders
}

#[test]
fn frames_decode_with_their_keys_in_any_order() {
    for m in server_messages() {
        let text = encode_server(&m);
        for order in key_orders(&text) {
            assert_eq!(decode_server(&order).unwrap(), m, "{order}");
        }
    }
    for m in client_messages() {
        let text = encode_client(&m);
        for order in key_orders(&text) {
            assert_eq!(decode_client(&order).unwrap(), m, "{order}");
        }
    }
}

#[test]
fn tagged_bodies_decode_with_the_tag_anywhere() {
    let items = [
        Item::Assignment(assignment(2, 5, Some("b")).into()),
        Item::Event(event(6, 2, "b")),
    ];
    for item in items {
        let text = encode_body(&item);
        assert!(text.starts_with("{\"kind\":"), "{text}");
        for order in key_orders(&text) {
            assert_eq!(decode_body::<Item>(&order, MAX_SERVER_FRAME).unwrap(), item);
        }
    }
    let outcomes = [
        Outcome::Accepted { seq: Seq(3) },
        Outcome::Rejected {
            code: RejectCode::StaleEpoch,
            current: Some(assignment(3, 7, Some("a")).into()),
            retry_after_ms: Some(10),
        },
    ];
    for outcome in outcomes {
        let text = encode_body(&outcome);
        for order in key_orders(&text) {
            assert_eq!(
                decode_body::<Outcome>(&order, MAX_CLIENT_FRAME).unwrap(),
                outcome
            );
        }
    }
    // Tag in the middle of a welcome's replayed item, inside a frame.
    let text = r#"{"v":1,"t":"welcome","you":"a","session":"a-s","missed":[{"seq":2,"epoch":1,
        "kind":"event","actor":"b","action":"vote","at":5}],"snapshot":{"room":"room-1","current":
        {"room":"room-1","host":null,"session":null,"epoch":1,"seq":1,"lease_ms":1,
        "reason":"elected","issued_at":0},"members":[],"seq":2,"server_time":0}}"#;
    match decode_server(text).unwrap() {
        ServerMsg::Welcome { missed, .. } => {
            assert!(matches!(&missed[..], [Item::Event(e)] if e.seq == Seq(2)))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tags_missing_unknown_or_twice_are_malformed() {
    let malformed = |r: Result<Item, DecodeError>| matches!(r, Err(DecodeError::Malformed { .. }));
    let item = |s: &str| decode_body::<Item>(s, MAX_SERVER_FRAME);
    let event = r#""seq":8,"epoch":3,"actor":"b","action":"vote","at":18"#;
    assert!(item(&format!("{{{event}}}")).is_err(), "missing tag");
    assert!(malformed(item(&format!(r#"{{"kind":"nope",{event}}}"#))));
    assert!(malformed(item(&format!(r#"{{"kind":0,{event}}}"#))));
    assert!(malformed(item(&format!(r#"{{"kind":null,{event}}}"#))));
    for twice in [
        format!(r#"{{"kind":"event","kind":"event",{event}}}"#),
        format!(r#"{{"kind":"event",{event},"kind":"event"}}"#),
        format!(r#"{{{event},"kind":"event","k\u0069nd":"event"}}"#),
    ] {
        assert!(malformed(item(&twice)), "{twice}");
    }
    // A duplicate field of the variant, before or after the tag.
    for dup in [
        format!(r#"{{"seq":1,"kind":"event",{event}}}"#),
        format!(r#"{{"kind":"event",{event},"seq":1}}"#),
    ] {
        assert!(malformed(item(&dup)), "{dup}");
    }
    // An escaped tag key is the tag.
    assert!(item(&format!(r#"{{{event},"\u006bind":"event"}}"#)).is_ok());
    for bad in ["{}", "null", "[]", r#"["event",8,3,"b","vote",null,18]"#] {
        assert!(malformed(item(bad)), "{bad}");
    }
    // Frames: a command result's outcome tag the same way.
    let result = |o: &str| format!(r#"{{"v":1,"t":"command_result","id":"k",{o}"seq":1}}"#);
    assert!(decode_server(&result(r#""outcome":"accepted","#)).is_ok());
    for bad in [
        "",
        r#""outcome":"maybe","#,
        r#""outcome":1,"#,
        r#""outcome":"accepted","outcome":"accepted","#,
    ] {
        assert!(
            matches!(
                decode_server(&result(bad)),
                Err(DecodeError::Malformed { .. })
            ),
            "{bad}"
        );
    }
    // A frame's `t` twice, or not a string.
    for bad in [
        r#"{"v":1,"t":"leave","t":"leave"}"#,
        r#"{"v":1,"t":5}"#,
        r#"[1,"leave"]"#,
    ] {
        assert!(
            matches!(decode_client(bad), Err(DecodeError::Malformed { .. })),
            "{bad}"
        );
    }
    assert_eq!(decode_client(r#"{"v":1}"#), Err(DecodeError::UnknownType));
}

#[test]
fn fields_of_another_variant_are_ignored_whatever_their_type() {
    // Unknown fields are ignored, and to an event, an assignment's fields are unknown fields
    // (before the tag or after it), and the other way round.
    let event = r#""seq":8,"epoch":3,"actor":"b","action":"vote","at":18"#;
    for text in [
        format!(r#"{{"room":5,"reason":[],"kind":"event",{event},"sig":{{}}}}"#),
        format!(r#"{{"kind":"event","host":"not an id!",{event}}}"#),
    ] {
        let item = decode_body::<Item>(&text, MAX_SERVER_FRAME).unwrap();
        assert_eq!(item.seq(), Seq(8), "{text}");
    }
    let text = r#"{"actor":5,"payload":"x","room":"r","host":null,"session":null,"epoch":1,
        "seq":1,"lease_ms":1,"reason":"elected","issued_at":0,"kind":"assignment","at":"x"}"#;
    assert!(matches!(
        decode_body::<Item>(text, MAX_SERVER_FRAME).unwrap(),
        Item::Assignment(_)
    ));
    let text = r#"{"seq":"x","outcome":"rejected","code":"not_host","future":1}"#;
    assert!(matches!(
        decode_body::<Outcome>(text, MAX_CLIENT_FRAME).unwrap(),
        Outcome::Rejected { .. }
    ));
    let text = r#"{"v":1,"t":"command_result","code":5,"id":"k","outcome":"accepted","seq":1}"#;
    assert!(decode_server(text).is_ok());
    // The same field of the right variant with a wrong type is still malformed.
    let text = r#"{"v":1,"t":"command_result","id":"k","outcome":"accepted","seq":"x"}"#;
    assert!(matches!(
        decode_server(text),
        Err(DecodeError::Malformed { .. })
    ));
}

#[test]
fn signed_assignments_read_their_flattened_fields() {
    let a = assignment(3, 7, Some("a"));
    let signed = SignedAssignment {
        assignment: a.clone(),
        kid: Some(KeyId::new("k1").unwrap()),
        sig: Some("c2ln".into()),
    };
    let text = encode_body(&signed);
    for order in key_orders(&text) {
        assert_eq!(
            decode_body::<SignedAssignment>(&order, MAX_CLIENT_FRAME).unwrap(),
            signed
        );
    }
    // kid and sig may be absent; the assignment's fields may not.
    let unsigned = encode_body(&a);
    assert_eq!(
        decode_body::<SignedAssignment>(&unsigned, MAX_CLIENT_FRAME).unwrap(),
        SignedAssignment::from(a)
    );
    let no_room = unsigned.replace("\"room\":\"room-1\",", "");
    assert!(decode_body::<SignedAssignment>(&no_room, MAX_CLIENT_FRAME).is_err());
    let twice = unsigned.replace(
        "\"room\":\"room-1\",",
        "\"room\":\"room-1\",\"room\":\"x\",",
    );
    assert!(decode_body::<SignedAssignment>(&twice, MAX_CLIENT_FRAME).is_err());
}

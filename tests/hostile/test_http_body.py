"""The request body's framing over HTTP: Inference-Header-Content-Length and Content-Encoding (issue 14 item 12).

Strict where Triton is lax: Triton 2.51 reads "+5" and " 5 " as 5 and "1_0" as 1, refuses a valid
multi-member gzip body and ignores junk after a gzip stream; here the header is plain digits, every
gzip member is read, and anything after the last stream (or a stream cut short) is a 400.
"""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from test_malformed_http import add_sub, assert_refused, assert_serving, fronts  # noqa: F401 - fixture


@pytest.mark.parametrize("value", ["+5", "1_0", "5x", "-1", "99999999999999999999999"])
def test_inference_header_content_length_must_be_plain_digits(fronts, value):
    r = fronts.http.post("/v2/models/add_sub_x2/infer", content=b'{"inputs":[]}',
                         headers={"Inference-Header-Content-Length": value})
    assert_refused(r, "inference header size")
    assert_serving(fronts)


def test_multi_member_gzip_is_read_and_trailing_junk_refused(fronts):
    body = json.dumps(add_sub()).encode()
    half = len(body) // 2
    multi = gzip.compress(body[:half]) + gzip.compress(body[half:])
    r = fronts.http.post("/v2/models/add_sub_x2/infer", content=multi, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    for encoding, data in [("gzip", gzip.compress(body) + b"JUNKJUNK"), ("deflate", zlib.compress(body) + b"xx"),
                           ("gzip", gzip.compress(body)[:-6])]:
        r = fronts.http.post("/v2/models/add_sub_x2/infer", content=data, headers={"Content-Encoding": encoding})
        assert_refused(r, "failed to decompress the request body")
    assert_serving(fronts)

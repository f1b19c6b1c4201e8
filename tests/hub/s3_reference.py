#!/usr/bin/env python3
"""The independent side of ktune's S3 tests: boto3 (botocore's own SigV4) reads and writes the
moto server the C++ client talks to.

    python3 s3_reference.py ENDPOINT KEY SECRET put BUCKET KEY FILE [KEY FILE ...]
    python3 s3_reference.py ENDPOINT KEY SECRET get BUCKET KEY FILE
    python3 s3_reference.py ENDPOINT KEY SECRET list BUCKET PREFIX      (prints key<TAB>size lines)
    python3 s3_reference.py ENDPOINT KEY SECRET uploads BUCKET PREFIX   (multipart uploads in progress: key lines)
    python3 s3_reference.py sign METHOD HOST PATH QUERY AMZDATE REGION SERVICE KEY SECRET [TOKEN]
        (prints the Authorization header botocore computes; QUERY is "a=1&b=2" or "-")
"""
import sys

import boto3
from botocore.config import Config


def client(endpoint, key, secret):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key,
                        aws_secret_access_key=secret, config=Config(s3={"addressing_style": "path"}))


def sign(method, host, path, query, amzdate, region, service, key, secret, token=None):
    import datetime
    from unittest import mock

    from botocore.auth import S3SigV4Auth, SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    url = f"http://{host}{path}" + ("" if query == "-" else "?" + query)
    req = AWSRequest(method=method, url=url, headers={})
    creds = Credentials(key, secret, token)
    auth = (S3SigV4Auth if service == "s3" else SigV4Auth)(creds, service, region)
    when = datetime.datetime.strptime(amzdate, "%Y%m%dT%H%M%SZ")
    with mock.patch("botocore.auth.get_current_datetime", return_value=when):
        auth.add_auth(req)
    print(req.headers["Authorization"])


def main(argv):
    if argv[0] == "sign":
        return sign(*argv[1:])
    endpoint, key, secret, op = argv[:4]
    s3 = client(endpoint, key, secret)
    if op == "put":
        rest = argv[5:]
        for key, path in zip(rest[0::2], rest[1::2]):
            s3.upload_file(path, argv[4], key)
    elif op == "get":
        s3.download_file(argv[4], argv[5], argv[6])
    elif op == "list":
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=argv[4], Prefix=argv[5]):
            for o in page.get("Contents", []):
                print(f"{o['Key']}\t{o['Size']}")
    elif op == "uploads":
        for u in s3.list_multipart_uploads(Bucket=argv[4], Prefix=argv[5]).get("Uploads", []):
            print(u["Key"])


if __name__ == "__main__":
    main(sys.argv[1:])

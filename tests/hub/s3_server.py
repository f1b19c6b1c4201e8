#!/usr/bin/env python3
"""An S3-compatible server on loopback for ktune's S3 tests: moto in server mode, with
signature checking switched on (moto verifies SigV4 once its first few unauthenticated actions
are used up: here, the IAM calls that create the test user and its access key).

    python3 s3_server.py [--bucket ktune-test] [--max-seconds 300]

Prints one JSON line {"port", "access_key_id", "secret_access_key", "bucket", "role_arn",
"powerless_role_arn"} on stdout (roles anyone may assume through STS, with AssumeRole or
AssumeRoleWithWebIdentity: the first allowed everything in S3 and to assume roles, the second
nothing), then
serves until its stdin closes (the test that started it is gone), SIGTERM, or --max-seconds.
Exits with status 3 and a message on stderr when moto (or boto3) is not installed.
"""
import argparse
import json
import os
import signal
import sys
import threading

# Six unauthenticated actions: create_user, put_user_policy, create_role and put_role_policy
# (the role with S3 access), create_role (a role allowed nothing), create_access_key. Everything
# after that (bucket creation included) must carry a valid SigV4 signature.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "6"

try:
    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer
except ImportError as e:  # the C++ test turns this into a visible skip
    print(f"moto/boto3 missing: {e}", file=sys.stderr)
    sys.exit(3)


def canonical_query_as_aws_computes_it():
    """moto checks SigV4 over the query string as its web layer hands it over, partly decoded
    (a '/' in ?prefix=a%2F arrives as '/'), so even boto3's own signed listings of a prefix with a
    '/' are refused. AWS computes the canonical query from the decoded parameters, re-encoded
    (RFC 3986). This re-encodes the query the same way before moto's check; the check itself (the
    signature over method, path, headers, payload hash, query) is left as it is."""
    from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

    from moto.core.authorization import ActionAuthenticatorMixin
    original = ActionAuthenticatorMixin._authenticate_and_authorize_action

    def patched(self, iam_request_cls, resource="*"):
        # AssumeRoleWithWebIdentity is unsigned in AWS (the token is the proof); moto would
        # try to authenticate it once its unauthenticated actions are used up.
        if self.querystring.get("Action") == ["AssumeRoleWithWebIdentity"]:
            return None
        parts = urlsplit(self.uri)
        if parts.query:
            pairs = parse_qsl(parts.query, keep_blank_values=True)
            query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in pairs)
            self.uri = urlunsplit(parts._replace(query=query))
        return original(self, iam_request_cls, resource)

    ActionAuthenticatorMixin._authenticate_and_authorize_action = patched


def main():
    canonical_query_as_aws_computes_it()
    ap = argparse.ArgumentParser()
    ap.add_argument("--bucket", default="ktune-test")
    ap.add_argument("--max-seconds", type=float, default=300)
    args = ap.parse_args()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    endpoint = f"http://127.0.0.1:{port}"
    kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
              aws_secret_access_key="setup")
    iam = boto3.client("iam", **kw)
    iam.create_user(UserName="ktune")
    iam.put_user_policy(UserName="ktune", PolicyName="s3-all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole"], "Resource": "*"}]}))
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
                                                     "Action": ["sts:AssumeRole", "sts:AssumeRoleWithWebIdentity"]}]}
    role = iam.create_role(RoleName="ktune-reader", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    iam.put_role_policy(RoleName="ktune-reader", PolicyName="s3-all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole"], "Resource": "*"}]}))
    nothing = iam.create_role(RoleName="ktune-nothing", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    key = iam.create_access_key(UserName="ktune")["AccessKey"]
    kw.update(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    s3 = boto3.client("s3", config=Config(s3={"addressing_style": "path"}), **kw)
    s3.create_bucket(Bucket=args.bucket)
    print(json.dumps({"port": port, "access_key_id": key["AccessKeyId"],
                      "secret_access_key": key["SecretAccessKey"], "bucket": args.bucket,
                      "role_arn": role["Arn"], "powerless_role_arn": nothing["Arn"]}), flush=True)

    def stop(*_):
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    threading.Timer(args.max_seconds, stop).start()
    sys.stdin.read()
    stop()


if __name__ == "__main__":
    main()

"""Runs on a unit's node at boot, not in the CDK app: fetch one artifact from the deployment's S3
bucket with the instance role's credentials and keep it only if its SHA-256 is the pinned one.

The launch template's user data carries this file's text (stacks/node_boot.py) and runs it with the
AMI's own python3 (Python 3.9 on AL2023, where cloud-init and dnf run): standard library only, no
AWS CLI (the ECS AMI is built from the AL2023 minimal AMI and does not install it). The request goes
to the bucket's regional endpoint, which the VPC's S3 gateway endpoint carries: no NAT, no internet.
Usage: python3 node_fetch.py BUCKET KEY SHA256 DEST. Exit 0: DEST holds the verified file; 2: the
object is missing or unreadable; 3: its SHA-256 differs; 4: S3 or the instance metadata service did
not answer. Every failure prints one line starting "flotilla:" on stderr and leaves no DEST behind.
"""

import datetime
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

# The instance metadata service (IMDSv2: a session token first, then the data), per the EC2 user
# guide, "Use the Instance Metadata Service to access instance metadata".
IMDS = "http://169.254.169.254"
# S3's regional endpoints, virtual-hosted style (S3 user guide, "Virtual hosting of buckets"); a bucket
# name with a dot breaks the TLS wildcard in that form, so it goes in the path instead.
S3_VIRTUAL_HOSTED = "https://{bucket}.s3.{region}.{domain}/{key}"
S3_PATH_STYLE = "https://s3.{region}.{domain}/{bucket}/{key}"
ATTEMPTS = 5  # network errors and S3 5xx only; each attempt's socket waits at most TIMEOUT_S
TIMEOUT_S = 30
CHUNK = 1 << 20
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class Failed(Exception):
    """A reason the boot stops, with the exit status it stops with."""

    def __init__(self, status, reason):
        super().__init__(reason)
        self.status = status


def imds(path, token=None, method="GET"):
    headers = {"X-aws-ec2-metadata-token": token} if token else {"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    request = urllib.request.Request(IMDS + path, method=method, headers=headers)  # noqa: S310 - IMDS
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - the link-local IMDS
            return response.read().decode()
    except (urllib.error.URLError, OSError) as err:
        raise Failed(4, f"the instance metadata service did not answer {path} ({err})") from None


def instance_context():
    """(region, DNS domain, credentials) of this instance: its instance profile's role."""
    token = imds("/latest/api/token", method="PUT")
    region = imds("/latest/meta-data/placement/region", token)
    domain = imds("/latest/meta-data/services/domain", token)
    role = imds("/latest/meta-data/iam/security-credentials/", token).strip().splitlines()[0]
    creds = json.loads(imds(f"/latest/meta-data/iam/security-credentials/{role}", token))
    return region, domain, creds


def object_url(bucket, key, region, domain):
    template = S3_PATH_STYLE if "." in bucket else S3_VIRTUAL_HOSTED
    return template.format(bucket=bucket, key=urllib.parse.quote(key, safe="/-_.~"), region=region, domain=domain)


def _hmac(key, text):
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signed_headers(url, region, creds, now):
    """Signature Version 4 headers of a GET of `url` (AWS General Reference, "Create a signed AWS
    API request": canonical request, string to sign, signing key, Authorization header)."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    scope = f"{amz_date[:8]}/{region}/s3/aws4_request"
    headers = {
        "host": parts.netloc,
        "x-amz-content-sha256": EMPTY_SHA256,
        "x-amz-date": amz_date,
        "x-amz-security-token": creds["Token"],
    }
    names = ";".join(sorted(headers))
    canonical = "\n".join(
        ["GET", parts.path, parts.query, *(f"{n}:{headers[n]}" for n in sorted(headers)), "", names, EMPTY_SHA256]
    )
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + creds["SecretAccessKey"]).encode()
    for part in (amz_date[:8], region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds['AccessKeyId']}/{scope}, SignedHeaders={names}, Signature={signature}"
    )
    del headers["host"]  # urllib sends it from the URL, as signed
    return headers


def download(url, region, creds, partial):
    """Stream the object into `partial`; -> its SHA-256. Retries network errors and S3 5xx."""
    for attempt in range(1, ATTEMPTS + 1):
        now = datetime.datetime.now(datetime.timezone.utc)
        request = urllib.request.Request(url, headers=signed_headers(url, region, creds, now))  # noqa: S310 - https S3
        digest = hashlib.sha256()
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response, open(partial, "wb") as out:  # noqa: S310
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
            return digest.hexdigest()
        except urllib.error.HTTPError as err:
            elsewhere = err.headers.get("x-amz-bucket-region")
            if elsewhere and elsewhere != region:
                raise Failed(
                    2,
                    f"the bucket is in {elsewhere}, this node in {region}: stage the artifacts in a "
                    "bucket of the deployment's region, which the S3 gateway endpoint reaches",
                ) from None
            if err.code in (403, 404):
                # S3 answers 403, not 404, for a missing key when the reader may not list the bucket
                # (S3 API reference, GetObject, "Permissions"): the instance role may not.
                raise Failed(
                    2, f"HTTP {err.code}: the object is missing or this instance's role may not read it"
                ) from None
            if err.code < 500 or attempt == ATTEMPTS:
                raise Failed(4, f"HTTP {err.code} from S3") from None
        except (urllib.error.URLError, OSError) as err:
            if attempt == ATTEMPTS:
                raise Failed(
                    4, f"S3 did not answer ({err}); the VPC's S3 gateway endpoint carries this request"
                ) from None
        time.sleep(2 ** (attempt - 1))
    raise AssertionError("unreachable")


def fetch(bucket, key, sha256, dest):
    region, domain, creds = instance_context()
    partial = dest + ".partial"
    try:
        actual = download(object_url(bucket, key, region, domain), region, creds, partial)
        if actual != sha256:
            raise Failed(3, f"its SHA-256 is {actual}, the pinned one is {sha256}")
        os.replace(partial, dest)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def main(argv):
    if len(argv) != 4:
        print("usage: node_fetch.py BUCKET KEY SHA256 DEST", file=sys.stderr)
        return 64
    bucket, key, sha256, dest = argv
    try:
        fetch(bucket, key, sha256, dest)
    except Failed as failure:
        print(
            f"flotilla: boot artifact s3://{bucket}/{key}: {failure}; stage it with "
            "`flotilla node-artifacts stage` (docs/runbooks/node-boot-artifacts.md)",
            file=sys.stderr,
        )
        return failure.status
    print(f"flotilla: boot artifact s3://{bucket}/{key} fetched, SHA-256 {sha256} verified", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the TLS Secret should hold, step by step of a rotation, as a function of data and time.

The rotator's tests (``test_rotation.py``) drive these steps through an API server; here the rule
alone is asked, with no client: each step keeps every pair a replica may serve verifiable
against every ``caBundle`` the API server may hold.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cryptography import x509

from webhook.tls.certificates import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, issue_serving, new_ca
from webhook.tls.renewal import PROPAGATION, Renewal, issued_by
from webhook.tls.rotation import service_dns_names

START = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
RENEWAL = Renewal(
    service="reservation-webhook",
    namespace="cozy-reservation",
    dns_names=service_dns_names("reservation-webhook", "cozy-reservation"),
    ca_days=3650,
    serving_days=90,
    rotate_before=timedelta(days=30),
    ca_rotate_before=timedelta(days=365),
)


# A CA close to its end (inside ``ca_rotate_before``) and a pair it issued ten days ago.
ROTATION = START + (3650 - 364) * DAY


def near_the_end_of_the_ca() -> dict[str, bytes]:
    ca = new_ca("reservation-webhook CA", now=START, days=3650)
    pair = issue_serving(ca, dns_names=RENEWAL.dns_names, now=ROTATION - 10 * DAY, days=90)
    return {
        TLS_CERT: pair.cert_pem,
        TLS_KEY: pair.key_pem,
        CA_CERT: ca.cert_pem,
        CA_KEY: ca.key_pem,
    }


def bundle(data: dict[str, bytes]) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data[CA_CERT])


def serving(data: dict[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[TLS_CERT])


def test_a_fresh_secret_needs_nothing_until_its_pair_is_due() -> None:
    data = RENEWAL.fresh(START)
    plan = RENEWAL.plan(data, START + 59 * DAY, published=True)
    assert plan.changes == ()
    assert plan.data == data


def test_a_pair_due_for_renewal_is_issued_by_the_same_ca_so_the_bundle_stays() -> None:
    data = RENEWAL.fresh(START)
    plan = RENEWAL.plan(data, START + 61 * DAY, published=True)
    assert plan.changes == ("new serving pair",)
    assert plan.data[CA_CERT] == data[CA_CERT]
    assert plan.data[TLS_CERT] != data[TLS_CERT]
    assert issued_by(serving(plan.data), bundle(data)[0])


def test_a_ca_due_for_rotation_is_published_first_and_the_old_pair_keeps_serving() -> None:
    data = near_the_end_of_the_ca()
    plan = RENEWAL.plan(data, ROTATION, published=True)
    new, old = bundle(plan.data)
    assert plan.changes == ("new CA, published next to the previous one",)
    assert old == bundle(data)[0]
    assert plan.data[CA_KEY] != data[CA_KEY]
    assert plan.data[TLS_CERT] == data[TLS_CERT]  # not switched before the bundle is published
    assert issued_by(serving(plan.data), old)
    assert not issued_by(serving(plan.data), new)


def test_the_pair_switches_to_the_new_ca_only_once_the_bundle_is_published() -> None:
    published = RENEWAL.plan(near_the_end_of_the_ca(), ROTATION, published=True).data
    unpublished = RENEWAL.plan(published, ROTATION + DAY, published=False)
    assert unpublished.changes == ()
    switched = RENEWAL.plan(published, ROTATION + DAY, published=True)
    assert switched.changes == ("new serving pair",)
    assert issued_by(serving(switched.data), bundle(published)[0])
    assert len(bundle(switched.data)) == 2  # the old CA stays while replicas pick the pair up


def test_the_old_ca_leaves_the_bundle_only_after_the_new_pair_has_propagated() -> None:
    published = RENEWAL.plan(near_the_end_of_the_ca(), ROTATION, published=True).data
    switched = RENEWAL.plan(published, ROTATION + DAY, published=True).data
    early = RENEWAL.plan(switched, ROTATION + DAY + PROPAGATION / 2, published=True)
    assert early.changes == ()
    late = RENEWAL.plan(switched, ROTATION + DAY + 2 * PROPAGATION, published=True)
    assert late.changes == ("dropped the previous CA",)
    assert bundle(late.data) == bundle(switched)[:1]

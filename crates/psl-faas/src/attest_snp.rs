//! The `snp` attestation backend's verifier: AMD SEV-SNP attestation reports.
//!
//! A report (1184 bytes, ABI versions 2 to 5) is signed (ECDSA P-384, SHA-384) by the chip's
//! **VCEK**, a key derived from the chip's unique secret and its TCB (the security patch levels
//! of bootloader, TEE, SNP firmware and microcode; on Turin also the FMC). AMD certifies each
//! VCEK (an X.509 certificate naming the chip id and the TCB in extensions) with the product
//! line's **ASK**, itself certified by the product line's root, the **ARK** (both RSA-4096,
//! RSASSA-PSS with SHA-384). The verifier checks, in order (each one recorded in the
//! [`CheckLog`]):
//!
//! 1. the report's form: exact length, a known version, ECDSA P-384 signature algorithm,
//!    signed by a VCEK (a VLEK or a masked chip key is refused), and every unsigned byte of the
//!    signature area zero (so no bit can change unnoticed);
//! 2. the certificate chain: the ARK is one of the trust anchors (AMD's Milan, Genoa and Turin
//!    ARKs by default, [`SnpTrustAnchors::amd`]; a test PKI via [`SnpTrustAnchors::from_ders`]),
//!    the ASK is signed by it, the VCEK by the ASK, each valid at the verification time, and
//!    every certificate the evidence carries is one of these (a stray or altered one is refused,
//!    not ignored); the ASK is not revoked by the product's CRL when one is known (signed by the
//!    ARK, inside its validity window and the policy's freshness bound);
//! 3. the VCEK's extensions: its product name is the ARK's product line, its hardware id is the
//!    report's chip id, its TCB (`blSPL`, `teeSPL`, `snpSPL`, `ucodeSPL`, `fmcSPL`, the reserved
//!    SPLs) is the report's reported TCB;
//! 4. the report's signature under the VCEK's key;
//! 5. the policy ([`SnpPolicy`]): debug disallowed, a migration agent disallowed (guest policy
//!    bit and `REPORT_ID_MA`), VMPL in the accepted set, SMT if refused, the reported TCB at or
//!    above the minimum of each component, the guest SVN;
//! 6. the measurement: [`snp_measurement`] (launch digest and guest policy) or
//!    [`snp_measurement_any_policy`] (launch digest alone) in the allowed set;
//! 7. the report data: `report_data (32) ‖ nonce (32)` as for DCAP
//!    ([`crate::attest::check_report_data`]).
//!
//! VCEKs come from the evidence's certificate table (what the platform's `auxblob` carried) or
//! from a [`SnpCollateral`] cache: a directory of VCEK certificates (as fetched from AMD's KDS,
//! or learnt from earlier evidence) and CRL files. The crate `sev` was not used: with
//! `crypto_nossl` it adds about 40 crates (a second `x509-cert`/`der`/`spki` generation, `rsa`,
//! `p384`, `dirs`, `uuid`, ...; 55 s to build on 2 cores) and checks neither validity windows nor
//! the VCEK's extensions nor CRLs; this module uses `aws-lc-rs` (already the workspace's
//! crypto) for ECDSA P-384 and RSA-PSS and `x509-cert` (already built for `dcap-qvl`).
//!
//! Evidence bytes (backend `snp`): `"PSLSNP01" ‖ report (1184) ‖ u32 LE table length ‖
//! certificate table` (the GHCB certificate table layout: 24-byte entries `GUID (16) ‖ offset
//! u32 LE ‖ length u32 LE`, an all-zero entry, then the certificates; PSL's encoding is the
//! canonical one: known GUIDs only, data packed in entry order).

use crate::attest::{
    check_report_data, AttestError, AttestPolicy, AttestVerifier, CheckLog, Evidence, Expected, Measurement, TeeKind,
    VerifiedReport, VerifyTime,
};
use parking_lot::RwLock;
use psl_crypto::sha256;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use x509_cert::der::Decode;
use x509_cert::spki::ObjectIdentifier;

pub use crate::attest::SNP_BACKEND;
/// Length of an attestation report.
pub const SNP_REPORT_LEN: usize = 1184;
/// The signed part of a report: everything before the signature.
const SIGNED_LEN: usize = 0x2A0;
const SIG_R: usize = 0x2A0;
const SIG_S: usize = 0x2E8;
/// The evidence envelope's magic.
pub const ENVELOPE_MAGIC: &[u8; 8] = b"PSLSNP01";
/// Largest certificate table carried in evidence (a VCEK, ASK and ARK take about 5 KiB).
pub const CERT_TABLE_BYTES_MAX: usize = 32 * 1024;
/// Most certificates kept in memory by a [`SnpCollateral`].
pub const CACHED_VCEKS_MAX: usize = 4096;

/// GUIDs of the certificate table (GHCB specification), in the byte order of their text form.
pub const GUID_VCEK: [u8; 16] = guid(0x63da758d, 0xe664, 0x4564, [0xad, 0xc5, 0xf4, 0xb9, 0x3b, 0xe8, 0xac, 0xcd]);
/// GUID of the VLEK entry (the versioned loaded endorsement key, used instead of a VCEK).
pub const GUID_VLEK: [u8; 16] = guid(0xa8074bc2, 0xa25a, 0x483e, [0xaa, 0xe6, 0x39, 0xc0, 0x45, 0xa0, 0xb8, 0xa1]);
/// GUID of the ASK entry (AMD SEV key, the intermediate that signs the VCEK).
pub const GUID_ASK: [u8; 16] = guid(0x4ab7b379, 0xbbac, 0x4fe4, [0xa0, 0x2f, 0x05, 0xae, 0xf3, 0x27, 0xc7, 0x82]);
/// GUID of the ARK entry (AMD root key).
pub const GUID_ARK: [u8; 16] = guid(0xc0b406a4, 0xa803, 0x4952, [0x97, 0x43, 0x3f, 0xb6, 0x01, 0x4c, 0xd0, 0xae]);

const fn guid(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_be_bytes();
    let b = b.to_be_bytes();
    let c = c.to_be_bytes();
    [a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]
}

/// AMD's roots (ARK) and intermediates (ASK), DER, as published by AMD's key distribution
/// service (kdsintf.amd.com/vcek/v1/{product}/cert_chain). SHA-256 fingerprints:
/// ARK-Milan 69d063b4…540bcd, ARK-Genoa 4c6598d1…3db2f1, ARK-Turin 1f084161…dd3f6a;
/// SEV-Milan 67d303bd…0bac1b, SEV-Genoa 5464738c…828521, SEV-Turin 5b77ef5f…3b3185.
pub const AMD_ARK_MILAN: &[u8] = include_bytes!("amd/ark_milan.der");
/// AMD's root key (ARK) for Genoa, DER; a built-in trust anchor.
pub const AMD_ARK_GENOA: &[u8] = include_bytes!("amd/ark_genoa.der");
/// AMD's root key (ARK) for Turin, DER; a built-in trust anchor.
pub const AMD_ARK_TURIN: &[u8] = include_bytes!("amd/ark_turin.der");
/// AMD's SEV signing key (ASK) for Milan, DER, signed by the Milan ARK.
pub const AMD_ASK_MILAN: &[u8] = include_bytes!("amd/ask_milan.der");
/// AMD's SEV signing key (ASK) for Genoa, DER, signed by the Genoa ARK.
pub const AMD_ASK_GENOA: &[u8] = include_bytes!("amd/ask_genoa.der");
/// AMD's SEV signing key (ASK) for Turin, DER, signed by the Turin ARK.
pub const AMD_ASK_TURIN: &[u8] = include_bytes!("amd/ask_turin.der");

const OID_RSASSA_PSS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.10");
const OID_ECDSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_SECP384R1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const OID_PRODUCT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.2");
const OID_BL_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.1");
const OID_TEE_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.2");
const OID_SNP_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.3");
const OID_SPL_4: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.4");
const OID_SPL_5: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.5");
const OID_SPL_6: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.6");
const OID_SPL_7: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.7");
const OID_UCODE_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.8");
const OID_FMC_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.9");
const OID_HW_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.4");

/// Guest policy bits (SEV-SNP ABI, GUEST_POLICY).
pub const POLICY_SMT: u64 = 1 << 16;
/// Guest policy bit MIGRATE_MA: the guest may be associated with a migration agent.
pub const POLICY_MIGRATE_MA: u64 = 1 << 18;
/// Guest policy bit DEBUG: the hypervisor may debug the guest (its memory is not private).
pub const POLICY_DEBUG: u64 = 1 << 19;
/// PLATFORM_INFO bit 0: SMT is enabled on the host.
pub const PLATFORM_SMT_EN: u64 = 1;

/// An AMD EPYC product line with SEV-SNP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Product {
    /// Zen 3 (EPYC 7003).
    Milan,
    /// Zen 4 (EPYC 9004).
    Genoa,
    /// Zen 5 (EPYC 9005).
    Turin,
}

impl Product {
    /// The product line's name as AMD's KDS and the VCEK's product-name extension spell it.
    pub fn name(self) -> &'static str {
        match self {
            Product::Milan => "Milan",
            Product::Genoa => "Genoa",
            Product::Turin => "Turin",
        }
    }

    fn from_name(s: &str) -> Option<Product> {
        [Product::Milan, Product::Genoa, Product::Turin].into_iter().find(|p| p.name() == s)
    }

    /// Decodes a TCB_VERSION (8 bytes, little-endian u64) in this product's layout.
    pub fn tcb(self, raw: u64) -> Tcb {
        let b = raw.to_le_bytes();
        match self {
            Product::Milan | Product::Genoa => Tcb {
                fmc: None,
                bootloader: b[0],
                tee: b[1],
                snp: b[6],
                microcode: b[7],
                reserved: [b[2], b[3], b[4], b[5]],
            },
            Product::Turin => Tcb {
                fmc: Some(b[0]),
                bootloader: b[1],
                tee: b[2],
                snp: b[3],
                microcode: b[7],
                reserved: [b[4], b[5], b[6], 0],
            },
        }
    }
}

/// A TCB version: the security patch level of each firmware component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Tcb {
    /// Turin only.
    pub fmc: Option<u8>,
    /// Bootloader SPL.
    pub bootloader: u8,
    /// PSP OS (TEE) SPL.
    pub tee: u8,
    /// SNP firmware SPL.
    pub snp: u8,
    /// CPU microcode SPL.
    pub microcode: u8,
    /// Bytes the layout reserves (must be zero in a VCEK's TCB; the `spl4`..`spl7` extensions).
    pub reserved: [u8; 4],
}

impl std::fmt::Display for Tcb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(fmc) = self.fmc {
            write!(f, "fmc {fmc}, ")?;
        }
        write!(f, "bootloader {}, tee {}, snp {}, microcode {}", self.bootloader, self.tee, self.snp, self.microcode)
    }
}

/// An attestation report, parsed (its bytes kept: the signature covers them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnpReport {
    /// The report's bytes as received (the signature covers the first 0x2A0 of them).
    pub raw: Vec<u8>,
    /// Report format version (2 to 5 accepted).
    pub version: u32,
    /// The guest's security version number, set by its ID block.
    pub guest_svn: u32,
    /// The guest policy the guest was launched with (`POLICY_*` bits).
    pub policy: u64,
    /// Family id from the guest's ID block.
    pub family_id: [u8; 16],
    /// Image id from the guest's ID block.
    pub image_id: [u8; 16],
    /// VMPL of the requester of the report (0 is the most privileged).
    pub vmpl: u32,
    /// Signature algorithm (1: ECDSA P-384 with SHA-384, the only one accepted).
    pub signature_algo: u32,
    /// The platform's current TCB version (raw; decode with `Product::tcb`).
    pub current_tcb: u64,
    /// Platform information bits (bit 0: SMT enabled).
    pub platform_info: u64,
    /// Bit 0 AUTHOR_KEY_EN, bit 1 MASK_CHIP_KEY, bits 4:2 SIGNING_KEY (0 VCEK, 1 VLEK).
    pub key_info: u32,
    /// The 64 bytes the guest asked to be bound into the report (what verifiers check the binding of).
    pub report_data: [u8; 64],
    /// The launch measurement of the guest (SHA-384).
    pub measurement: [u8; 48],
    /// Data the hypervisor supplied at launch.
    pub host_data: [u8; 32],
    /// SHA-384 of the ID key that signed the guest's ID block (zero without one).
    pub id_key_digest: [u8; 48],
    /// SHA-384 of the author key that certified the ID key (zero without one).
    pub author_key_digest: [u8; 48],
    /// Id of the guest, fixed at launch.
    pub report_id: [u8; 32],
    /// Id of the guest's migration agent (all ones when there is none).
    pub report_id_ma: [u8; 32],
    /// The TCB version the VCEK was derived from (raw; checked against the VCEK and the policy).
    pub reported_tcb: u64,
    /// The chip's unique id (zero when MASK_CHIP_ID is set).
    pub chip_id: [u8; 64],
    /// The platform's committed TCB version (raw).
    pub committed_tcb: u64,
    /// The TCB version at the guest's launch (raw).
    pub launch_tcb: u64,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn arr<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    b[o..o + N].try_into().expect("in bounds")
}

impl SnpReport {
    /// Parses a report and checks its form (not its signature): exact length, version 2 to 5,
    /// signature algorithm 1 (ECDSA P-384 with SHA-384), and zero in every unsigned byte of the
    /// signature area (the high bytes of R and S and the reserved tail).
    pub fn parse(b: &[u8]) -> Result<SnpReport, AttestError> {
        if b.len() != SNP_REPORT_LEN {
            return Err(AttestError::Malformed(format!("{} bytes, an SEV-SNP report is {SNP_REPORT_LEN}", b.len())));
        }
        let version = u32_at(b, 0);
        if !(2..=5).contains(&version) {
            return Err(AttestError::Malformed(format!("report version {version}, expected 2 to 5")));
        }
        let signature_algo = u32_at(b, 0x34);
        if signature_algo != 1 {
            return Err(AttestError::Malformed(format!(
                "signature algorithm {signature_algo}, expected 1 (ECDSA P-384 with SHA-384)"
            )));
        }
        let unsigned_zero = b[SIG_R + 48..SIG_R + 72].iter().chain(&b[SIG_S + 48..]).all(|x| *x == 0);
        if !unsigned_zero {
            return Err(AttestError::Malformed(
                "non-zero bytes in the unsigned part of the signature area (high bytes of R or S, or reserved)".into(),
            ));
        }
        Ok(SnpReport {
            raw: b.to_vec(),
            version,
            guest_svn: u32_at(b, 0x04),
            policy: u64_at(b, 0x08),
            family_id: arr(b, 0x10),
            image_id: arr(b, 0x20),
            vmpl: u32_at(b, 0x30),
            signature_algo,
            current_tcb: u64_at(b, 0x38),
            platform_info: u64_at(b, 0x40),
            key_info: u32_at(b, 0x48),
            report_data: arr(b, 0x50),
            measurement: arr(b, 0x90),
            host_data: arr(b, 0xC0),
            id_key_digest: arr(b, 0xE0),
            author_key_digest: arr(b, 0x110),
            report_id: arr(b, 0x140),
            report_id_ma: arr(b, 0x160),
            reported_tcb: u64_at(b, 0x180),
            chip_id: arr(b, 0x1A0),
            committed_tcb: u64_at(b, 0x1E0),
            launch_tcb: u64_at(b, 0x1F0),
        })
    }

    /// 0: VCEK, 1: VLEK, 7: none.
    pub fn signing_key(&self) -> u32 {
        (self.key_info >> 2) & 7
    }

    /// Whether the chip key is masked (MASK_CHIP_KEY): the report is then not signed.
    pub fn chip_key_masked(&self) -> bool {
        self.key_info & 2 != 0
    }

    /// The signature as fixed-length big-endian `r ‖ s` (96 bytes), as `aws-lc-rs` takes it.
    fn signature_fixed(&self) -> [u8; 96] {
        let mut sig = [0u8; 96];
        for i in 0..48 {
            sig[47 - i] = self.raw[SIG_R + i];
            sig[95 - i] = self.raw[SIG_S + i];
        }
        sig
    }

    /// Whether a migration agent is bound to the guest (`REPORT_ID_MA` is all ones otherwise).
    pub fn has_migration_agent(&self) -> bool {
        self.report_id_ma != [0xff; 32]
    }
}

/// The measurement digest of a launch digest under a guest policy.
pub fn snp_measurement(launch: &[u8; 48], guest_policy: u64) -> Measurement {
    sha256(&[b"psl/snp/v1", launch, &guest_policy.to_le_bytes()])
}

/// The measurement digest of a launch digest, whatever the guest policy (the policy's bit
/// checks still apply).
pub fn snp_measurement_any_policy(launch: &[u8; 48]) -> Measurement {
    sha256(&[b"psl/snp/any-policy/v1", launch])
}

/// The measurement digests a report offers, most specific first.
pub fn report_measurements(r: &SnpReport) -> [Measurement; 2] {
    [snp_measurement(&r.measurement, r.policy), snp_measurement_any_policy(&r.measurement)]
}

/// One certificate of a certificate table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableEntry {
    /// Which certificate the entry holds (`GUID_VCEK`, `GUID_VLEK`, `GUID_ASK`, `GUID_ARK`).
    pub guid: [u8; 16],
    /// The certificate's bytes (DER).
    pub data: Vec<u8>,
}

/// Parses a GHCB certificate table (as the kernel's `auxblob` gives it): entries until the
/// all-zero GUID, each pointing into the buffer. Bounded: at most 64 entries, every range inside
/// the buffer.
pub fn parse_cert_table(b: &[u8]) -> Result<Vec<TableEntry>, AttestError> {
    let bad = |why: String| AttestError::Malformed(format!("certificate table: {why}"));
    if b.len() > CERT_TABLE_BYTES_MAX {
        return Err(bad(format!("{} bytes, over {CERT_TABLE_BYTES_MAX}", b.len())));
    }
    let mut out = Vec::new();
    let mut at = 0usize;
    loop {
        let e = b.get(at..at + 24).ok_or_else(|| bad("no terminating entry".into()))?;
        let guid: [u8; 16] = e[..16].try_into().expect("16");
        let offset = u32_at(e, 16) as usize;
        let len = u32_at(e, 20) as usize;
        if guid == [0; 16] {
            return Ok(out);
        }
        if out.len() == 64 {
            return Err(bad("more than 64 entries".into()));
        }
        let data = offset
            .checked_add(len)
            .and_then(|end| b.get(offset..end))
            .ok_or_else(|| bad(format!("entry {} points outside the table", out.len())))?;
        out.push(TableEntry { guid, data: data.to_vec() });
        at += 24;
    }
}

/// The canonical encoding of a certificate table: entries, the zero entry, then the data packed
/// in entry order.
pub fn encode_cert_table(entries: &[TableEntry]) -> Vec<u8> {
    let mut head = Vec::new();
    let mut body = Vec::new();
    let data_start = 24 * (entries.len() + 1);
    for e in entries {
        head.extend_from_slice(&e.guid);
        head.extend_from_slice(&((data_start + body.len()) as u32).to_le_bytes());
        head.extend_from_slice(&(e.data.len() as u32).to_le_bytes());
        body.extend_from_slice(&e.data);
    }
    head.extend_from_slice(&[0u8; 24]);
    head.extend_from_slice(&body);
    head
}

/// Keeps the VCEK, ASK and ARK of a platform's table (what PSL's evidence carries).
pub fn known_entries(entries: Vec<TableEntry>) -> Vec<TableEntry> {
    entries.into_iter().filter(|e| [GUID_VCEK, GUID_ASK, GUID_ARK].contains(&e.guid)).collect()
}

/// PSL's `snp` evidence: the report and the certificate table.
pub fn encode_evidence(report: &[u8], entries: &[TableEntry]) -> Vec<u8> {
    let table = if entries.is_empty() { Vec::new() } else { encode_cert_table(entries) };
    let mut b = Vec::with_capacity(8 + report.len() + 4 + table.len());
    b.extend_from_slice(ENVELOPE_MAGIC);
    b.extend_from_slice(report);
    b.extend_from_slice(&(table.len() as u32).to_le_bytes());
    b.extend_from_slice(&table);
    b
}

/// Splits `snp` evidence into the report and its certificates. The table must be PSL's canonical
/// encoding of known entries (VCEK, ASK, ARK; each at most once): no byte of the evidence can
/// change without the evidence being refused.
pub fn decode_evidence(b: &[u8]) -> Result<(SnpReport, Vec<TableEntry>), AttestError> {
    let head = 8 + SNP_REPORT_LEN + 4;
    if b.len() < head || &b[..8] != ENVELOPE_MAGIC {
        return Err(AttestError::Malformed(format!(
            "{} bytes: snp evidence is PSLSNP01, a {SNP_REPORT_LEN}-byte report, a table length and a table",
            b.len()
        )));
    }
    let report = SnpReport::parse(&b[8..8 + SNP_REPORT_LEN])?;
    let len = u32_at(b, 8 + SNP_REPORT_LEN) as usize;
    if b.len() - head != len {
        return Err(AttestError::Malformed(format!(
            "certificate table length {len}, but {} bytes follow the report",
            b.len() - head
        )));
    }
    if len == 0 {
        return Ok((report, Vec::new()));
    }
    let table = &b[head..];
    let entries = parse_cert_table(table)?;
    for (i, e) in entries.iter().enumerate() {
        if ![GUID_VCEK, GUID_ASK, GUID_ARK].contains(&e.guid) {
            return Err(AttestError::Malformed(format!(
                "certificate table entry {i}: GUID {} is not a VCEK, ASK or ARK",
                hex::encode(e.guid)
            )));
        }
        if entries[..i].iter().any(|p| p.guid == e.guid) {
            return Err(AttestError::Malformed(format!("certificate table: GUID {} twice", hex::encode(e.guid))));
        }
    }
    if encode_cert_table(&entries) != table {
        return Err(AttestError::Malformed("certificate table is not in canonical form".into()));
    }
    Ok((report, entries))
}

/// The first DER element of `b`: (tag, header length, content length).
fn der_tlv(b: &[u8]) -> Option<(u8, usize, usize)> {
    let tag = *b.first()?;
    let l0 = *b.get(1)? as usize;
    if l0 < 0x80 {
        return Some((tag, 2, l0));
    }
    let n = l0 & 0x7f;
    if n == 0 || n > 4 {
        return None;
    }
    let mut len = 0usize;
    for i in 0..n {
        len = (len << 8) | *b.get(2 + i)? as usize;
    }
    Some((tag, 2 + n, len))
}

/// The exact bytes of the first element inside the outer SEQUENCE of a signed object (the
/// `tbsCertificate` / `tbsCertList`): what its signature covers.
fn signed_part(der: &[u8]) -> Option<&[u8]> {
    let (tag, h, len) = der_tlv(der)?;
    if tag != 0x30 || h + len != der.len() {
        return None;
    }
    let inner = &der[h..];
    let (tag, h2, len2) = der_tlv(inner)?;
    if tag != 0x30 {
        return None;
    }
    inner.get(..h2 + len2)
}

/// A parsed certificate with its original bytes.
#[derive(Clone, Debug)]
pub struct Cert {
    /// The certificate's DER bytes as given.
    pub der: Vec<u8>,
    /// The parsed certificate.
    pub x: x509_cert::Certificate,
}

impl Cert {
    /// Parses a DER certificate; `AttestError::Chain` if it does not parse or is not exactly
    /// one DER SEQUENCE.
    pub fn from_der(der: &[u8]) -> Result<Cert, AttestError> {
        let x = x509_cert::Certificate::from_der(der)
            .map_err(|e| AttestError::Chain(format!("certificate does not parse: {e}")))?;
        if signed_part(der).is_none() {
            return Err(AttestError::Chain("certificate is not one DER SEQUENCE".into()));
        }
        Ok(Cert { der: der.to_vec(), x })
    }

    /// From DER, or from the first PEM certificate in the text.
    pub fn from_der_or_pem(b: &[u8]) -> Result<Cert, AttestError> {
        if b.first() == Some(&0x30) {
            return Cert::from_der(b);
        }
        let p = pem::parse(b).map_err(|e| AttestError::Chain(format!("neither DER nor PEM: {e}")))?;
        Cert::from_der(p.contents())
    }

    /// The subject's distinguished name, as text.
    pub fn subject(&self) -> String {
        self.x.tbs_certificate().subject().to_string()
    }

    /// The subject's common name.
    pub fn cn(&self) -> String {
        common_name(&self.subject())
    }

    fn ext(&self, oid: &ObjectIdentifier) -> Option<&[u8]> {
        self.x.tbs_certificate().extensions()?.iter().find(|e| &e.extn_id == oid).map(|e| e.extn_value.as_bytes())
    }

    /// Valid at `t` (Unix seconds).
    pub fn check_validity(&self, t: u64, what: &str) -> Result<(), AttestError> {
        let v = self.x.tbs_certificate().validity();
        let (nb, na) = (v.not_before.to_unix_duration().as_secs(), v.not_after.to_unix_duration().as_secs());
        if t < nb || t > na {
            return Err(AttestError::Chain(format!(
                "{what} is valid from {} to {}, not at {}",
                crate::attest::fmt_utc(nb),
                crate::attest::fmt_utc(na),
                crate::attest::fmt_utc(t)
            )));
        }
        Ok(())
    }

    /// Checks that `issuer` (an RSA key) signed this certificate with RSASSA-PSS / SHA-384, that
    /// the outer signature algorithm is the signed one, and that the issuer names match.
    pub fn check_signed_by(&self, issuer: &Cert, what: &str) -> Result<(), AttestError> {
        let tbs = self.x.tbs_certificate();
        if tbs.issuer() != issuer.x.tbs_certificate().subject() {
            return Err(AttestError::Chain(format!(
                "{what}: issued by '{}', not by '{}'",
                tbs.issuer(),
                issuer.subject()
            )));
        }
        check_rsa_pss(&self.der, self.x.signature_algorithm(), tbs.signature(), self.x.signature(), issuer, what)
    }
}

impl Cert {
    /// Checks that `issuer` (a P-256 key) signed this certificate with ECDSA/SHA-256 (Intel's
    /// PKI for DCAP collateral), the outer algorithm being the signed one.
    pub fn check_ecdsa_p256_signed_by(&self, issuer: &Cert, what: &str) -> Result<(), AttestError> {
        use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1};
        let tbs = self.x.tbs_certificate();
        if tbs.issuer() != issuer.x.tbs_certificate().subject() {
            return Err(AttestError::Chain(format!(
                "{what}: issued by '{}', not by '{}'",
                tbs.issuer(),
                issuer.subject()
            )));
        }
        let (outer, inner) = (self.x.signature_algorithm(), tbs.signature());
        if outer != inner || outer.oid != OID_ECDSA_SHA256 {
            return Err(AttestError::Chain(format!("{what}: signature algorithm is not ECDSA with SHA-256")));
        }
        let sig = self.x.signature();
        if sig.unused_bits() != 0 {
            return Err(AttestError::Chain(format!("{what}: signature bit string has unused bits")));
        }
        let signed =
            signed_part(&self.der).ok_or_else(|| AttestError::Chain(format!("{what}: not one DER SEQUENCE")))?;
        let key = issuer.x.tbs_certificate().subject_public_key_info().subject_public_key.raw_bytes();
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, key)
            .verify(signed, sig.raw_bytes())
            .map_err(|_| AttestError::Chain(format!("{what}: the signature of '{}' does not verify", issuer.cn())))
    }
}

/// Verifies an RSASSA-PSS (SHA-384) signature of `issuer` over the signed part of `der`.
fn check_rsa_pss(
    der: &[u8],
    outer_alg: &x509_cert::spki::AlgorithmIdentifierOwned,
    inner_alg: &x509_cert::spki::AlgorithmIdentifierOwned,
    sig: &x509_cert::der::asn1::BitString,
    issuer: &Cert,
    what: &str,
) -> Result<(), AttestError> {
    use aws_lc_rs::signature::{UnparsedPublicKey, RSA_PSS_2048_8192_SHA384};
    if outer_alg != inner_alg || outer_alg.oid != OID_RSASSA_PSS {
        return Err(AttestError::Chain(format!(
            "{what}: signature algorithm {} (outer) / {} (signed), expected RSASSA-PSS",
            outer_alg.oid, inner_alg.oid
        )));
    }
    if sig.unused_bits() != 0 {
        return Err(AttestError::Chain(format!("{what}: signature bit string has unused bits")));
    }
    let signed = signed_part(der).ok_or_else(|| AttestError::Chain(format!("{what}: not one DER SEQUENCE")))?;
    let key = issuer.x.tbs_certificate().subject_public_key_info().subject_public_key.raw_bytes();
    UnparsedPublicKey::new(&RSA_PSS_2048_8192_SHA384, key)
        .verify(signed, sig.raw_bytes())
        .map_err(|_| AttestError::Chain(format!("{what}: the signature of '{}' does not verify", issuer.cn())))
}

fn common_name(dn: &str) -> String {
    dn.split(',').find_map(|p| p.trim().strip_prefix("CN=")).unwrap_or("").to_string()
}

/// What a VCEK certificate says about its chip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcekInfo {
    /// The product name extension (for example `Milan-B0`).
    pub product_name: String,
    /// The hardware id extension: the chip id it was issued for.
    pub hw_id: Vec<u8>,
    /// Bootloader SPL the VCEK was issued for.
    pub bl: u8,
    /// PSP OS (TEE) SPL the VCEK was issued for.
    pub tee: u8,
    /// SNP firmware SPL the VCEK was issued for.
    pub snp: u8,
    /// Microcode SPL the VCEK was issued for.
    pub ucode: u8,
    /// FMC SPL the VCEK was issued for (Turin only).
    pub fmc: Option<u8>,
    /// The `spl4`..`spl7` extensions, zero when absent.
    pub spl_reserved: [u8; 4],
}

/// An INTEGER 0..=255 in DER (the value of a `...SPL` extension).
fn der_small_int(b: &[u8]) -> Option<u8> {
    match b {
        [0x02, 1, v] if *v < 0x80 => Some(*v),
        [0x02, 2, 0, v] if *v >= 0x80 => Some(*v),
        _ => None,
    }
}

impl VcekInfo {
    /// Reads the product name, hardware id and SPL extensions; `AttestError::Chain` if one is
    /// missing or malformed.
    pub fn from_cert(c: &Cert) -> Result<VcekInfo, AttestError> {
        let bad = |what: &str| AttestError::Chain(format!("VCEK: extension {what} missing or malformed"));
        let spl = |oid: &ObjectIdentifier, what: &str| c.ext(oid).and_then(der_small_int).ok_or_else(|| bad(what));
        let name = c.ext(&OID_PRODUCT_NAME).ok_or_else(|| bad("productName"))?;
        // IA5String.
        let product_name = match name {
            [0x16, n, rest @ ..] if *n as usize == rest.len() && rest.is_ascii() => {
                String::from_utf8_lossy(rest).to_string()
            }
            _ => return Err(bad("productName")),
        };
        let hw_id = c.ext(&OID_HW_ID).ok_or_else(|| bad("hwID"))?.to_vec();
        let opt = |oid: &ObjectIdentifier, what: &str| -> Result<u8, AttestError> {
            match c.ext(oid) {
                None => Ok(0),
                Some(b) => der_small_int(b).ok_or_else(|| bad(what)),
            }
        };
        let fmc = match c.ext(&OID_FMC_SPL) {
            None => None,
            Some(b) => Some(der_small_int(b).ok_or_else(|| bad("fmcSPL"))?),
        };
        Ok(VcekInfo {
            product_name,
            hw_id,
            bl: spl(&OID_BL_SPL, "blSPL")?,
            tee: spl(&OID_TEE_SPL, "teeSPL")?,
            snp: spl(&OID_SNP_SPL, "snpSPL")?,
            ucode: spl(&OID_UCODE_SPL, "ucodeSPL")?,
            fmc,
            spl_reserved: [
                opt(&OID_SPL_4, "spl4")?,
                opt(&OID_SPL_5, "spl5")?,
                opt(&OID_SPL_6, "spl6")?,
                opt(&OID_SPL_7, "spl7")?,
            ],
        })
    }

    /// Whether this VCEK is the one for `chip_id` at `tcb` (decoded for `product`).
    pub fn matches(&self, product: Product, chip_id: &[u8; 64], tcb: &Tcb) -> Result<(), String> {
        let chip_ok = match (product, self.hw_id.len()) {
            (_, 64) => self.hw_id[..] == chip_id[..],
            // Turin VCEKs carry an 8-byte hardware id.
            (Product::Turin, 8) => self.hw_id[..] == chip_id[..8],
            _ => false,
        };
        if !chip_ok {
            return Err(format!(
                "the VCEK's hardware id {} is not the report's chip id {}",
                hex::encode(&self.hw_id),
                hex::encode(chip_id)
            ));
        }
        let mine = Tcb {
            fmc: self.fmc,
            bootloader: self.bl,
            tee: self.tee,
            snp: self.snp,
            microcode: self.ucode,
            reserved: self.spl_reserved,
        };
        let theirs = Tcb { reserved: [tcb.reserved[0], tcb.reserved[1], tcb.reserved[2], tcb.reserved[3]], ..*tcb };
        let fmc_ok = product != Product::Turin || mine.fmc == theirs.fmc;
        if !fmc_ok
            || (mine.bootloader, mine.tee, mine.snp, mine.microcode, mine.reserved)
                != (theirs.bootloader, theirs.tee, theirs.snp, theirs.microcode, theirs.reserved)
        {
            return Err(format!("the VCEK is for TCB ({mine}), the report's reported TCB is ({theirs})"));
        }
        Ok(())
    }
}

/// The roots of trust: one ARK per product line.
#[derive(Clone, Debug)]
pub struct SnpTrustAnchors {
    anchors: Vec<(Product, Cert)>,
    /// Intermediates known without evidence (AMD's ASKs by default); each is checked against
    /// its ARK whenever used.
    known_asks: Vec<Cert>,
}

impl SnpTrustAnchors {
    /// AMD's ARKs for Milan, Genoa and Turin (and their ASKs).
    pub fn amd() -> SnpTrustAnchors {
        let c = |d: &[u8]| Cert::from_der(d).expect("embedded AMD certificate parses");
        SnpTrustAnchors {
            anchors: vec![
                (Product::Milan, c(AMD_ARK_MILAN)),
                (Product::Genoa, c(AMD_ARK_GENOA)),
                (Product::Turin, c(AMD_ARK_TURIN)),
            ],
            known_asks: vec![c(AMD_ASK_MILAN), c(AMD_ASK_GENOA), c(AMD_ASK_TURIN)],
        }
    }

    /// Other ARKs (a test PKI, or a pinned subset): each must be self-signed (RSASSA-PSS) and
    /// named `ARK-<product>` (Milan, Genoa or Turin), which fixes the TCB layout.
    pub fn from_ders(arks: &[Vec<u8>]) -> Result<SnpTrustAnchors, AttestError> {
        let mut anchors = Vec::new();
        for d in arks {
            let c = Cert::from_der_or_pem(d)?;
            c.check_signed_by(&c, "ARK (self-signed)")?;
            let cn = c.cn();
            let product = cn
                .strip_prefix("ARK-")
                .and_then(Product::from_name)
                .ok_or_else(|| AttestError::Chain(format!("trust anchor '{cn}' is not named ARK-Milan/Genoa/Turin")))?;
            anchors.push((product, c));
        }
        if anchors.is_empty() {
            return Err(AttestError::Chain("no trust anchor given".into()));
        }
        Ok(SnpTrustAnchors { anchors, known_asks: Vec::new() })
    }

    /// The product lines with a trust anchor.
    pub fn products(&self) -> Vec<Product> {
        self.anchors.iter().map(|(p, _)| *p).collect()
    }
}

/// VCEKs and CRLs known to a verifier: files an operator put there (VCEKs fetched from AMD's KDS,
/// CRLs) and VCEKs learnt from earlier evidence. Every certificate is checked against the trust
/// anchors each time it is used, so the cache needs no protection beyond availability.
#[derive(Default)]
pub struct SnpCollateral {
    dir: Option<PathBuf>,
    vceks: RwLock<Vec<Vec<u8>>>,
    crls: Vec<Vec<u8>>,
}

impl SnpCollateral {
    /// An empty collateral set with no cache directory.
    pub fn new() -> SnpCollateral {
        SnpCollateral::default()
    }

    /// A cache in `dir` (created if missing): every `*.der`, `*.pem`, `*.crt` file there is a
    /// VCEK, every `*.crl` file a CRL; VCEKs learnt from evidence are written there.
    pub fn with_dir(dir: &Path) -> Result<SnpCollateral, AttestError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| AttestError::Collateral(format!("creating the VCEK cache {}: {e}", dir.display())))?;
        let mut c = SnpCollateral { dir: Some(dir.to_path_buf()), ..SnpCollateral::default() };
        let rd = std::fs::read_dir(dir)
            .map_err(|e| AttestError::Collateral(format!("reading the VCEK cache {}: {e}", dir.display())))?;
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            match p.extension().and_then(|e| e.to_str()) {
                Some("der" | "pem" | "crt") => c.add_vcek_file(&p)?,
                Some("crl") => c.add_crl_file(&p)?,
                _ => {}
            }
        }
        Ok(c)
    }

    /// Adds a VCEK file (DER or PEM); `AttestError::Collateral` if it cannot be read or parsed.
    pub fn add_vcek_file(&mut self, p: &Path) -> Result<(), AttestError> {
        let b = std::fs::read(p).map_err(|e| AttestError::Collateral(format!("reading VCEK {}: {e}", p.display())))?;
        let c = Cert::from_der_or_pem(&b).map_err(|e| AttestError::Collateral(format!("VCEK {}: {e}", p.display())))?;
        self.vceks.write().push(c.der);
        Ok(())
    }

    /// A CRL (DER or PEM) as AMD's KDS publishes it (`/vcek/v1/{product}/crl`).
    pub fn add_crl_file(&mut self, p: &Path) -> Result<(), AttestError> {
        let b = std::fs::read(p).map_err(|e| AttestError::Collateral(format!("reading CRL {}: {e}", p.display())))?;
        let der = if b.first() == Some(&0x30) {
            b
        } else {
            pem::parse(&b).map_err(|e| AttestError::Collateral(format!("CRL {}: {e}", p.display())))?.into_contents()
        };
        self.crls.push(der);
        Ok(())
    }

    /// Adds a CRL given as DER.
    pub fn add_crl(&mut self, der: Vec<u8>) {
        self.crls.push(der);
    }

    /// Remembers a VCEK learnt from evidence (also written to the cache directory if there is one);
    /// the oldest is dropped past `CACHED_VCEKS_MAX`.
    pub fn add_vcek(&self, der: &[u8]) {
        let mut v = self.vceks.write();
        if v.iter().any(|x| x == der) {
            return;
        }
        if v.len() >= CACHED_VCEKS_MAX {
            v.remove(0);
        }
        v.push(der.to_vec());
        drop(v);
        if let Some(dir) = &self.dir {
            let name = format!("vcek-{}.der", &psl_crypto::sha256(&[der]).to_hex()[..16]);
            if let Err(e) = std::fs::write(dir.join(&name), der) {
                tracing::warn!("cannot keep VCEK {name} in {}: {e}", dir.display());
            }
        }
    }

    fn vceks(&self) -> Vec<Vec<u8>> {
        self.vceks.read().clone()
    }

    /// How many VCEKs are known.
    pub fn len(&self) -> usize {
        self.vceks.read().len()
    }

    /// Whether no VCEK is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Minimum security patch levels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MinTcb {
    /// Minimum bootloader SPL.
    pub bootloader: u8,
    /// Minimum PSP OS (TEE) SPL.
    pub tee: u8,
    /// Minimum SNP firmware SPL.
    pub snp: u8,
    /// Minimum microcode SPL.
    pub microcode: u8,
    /// Minimum FMC SPL (checked on Turin only).
    pub fmc: u8,
}

/// The `snp` backend's policy.
#[derive(Clone, Debug)]
pub struct SnpPolicy {
    /// Allowed measurement digests ([`snp_measurement`], [`snp_measurement_any_policy`]).
    pub allowed: AttestPolicy,
    /// Accept guests whose policy allows debugging (never in production).
    pub allow_debug: bool,
    /// Accept guests that may be or are associated with a migration agent.
    pub allow_migration_agent: bool,
    /// Accept platforms with SMT enabled.
    pub allow_smt: bool,
    /// Accepted VMPLs of the report's requester.
    pub vmpls: Vec<u32>,
    /// Lowest accepted reported TCB, component by component.
    pub min_tcb: MinTcb,
    /// Lowest accepted guest SVN.
    pub min_guest_svn: u32,
    /// Refuse when no CRL for the product line is known.
    pub require_crl: bool,
    /// Refuse a CRL issued longer ago than this (seconds).
    pub crl_max_age_secs: Option<u64>,
    /// The time certificates and CRLs are checked at.
    pub time: VerifyTime,
}

impl Default for SnpPolicy {
    fn default() -> Self {
        SnpPolicy {
            allowed: AttestPolicy::default(),
            allow_debug: false,
            allow_migration_agent: false,
            allow_smt: true,
            vmpls: vec![0],
            min_tcb: MinTcb::default(),
            min_guest_svn: 0,
            require_crl: false,
            crl_max_age_secs: None,
            time: VerifyTime::Now,
        }
    }
}

/// What an SNP verification established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnpVerified {
    /// The product line whose chain verified the report.
    pub product: Product,
    /// The reported TCB, decoded for that product line.
    pub tcb: Tcb,
    /// The launch measurement.
    pub measurement: Measurement,
    /// The report data (checked against the expected binding by the caller).
    pub report_data: [u8; 64],
}

/// Verifies SEV-SNP evidence.
pub struct SnpVerifier {
    policy: SnpPolicy,
    anchors: SnpTrustAnchors,
    collateral: Arc<SnpCollateral>,
}

/// Checks the VCEK's extensions against the report (product line, chip id, reported TCB);
/// returns the reported TCB.
fn check_vcek_info(vcek: &Cert, product: Product, report: &SnpReport, log: &mut CheckLog) -> Result<Tcb, AttestError> {
    let info = VcekInfo::from_cert(vcek).map_err(|e| log.fail("VCEK extensions", e))?;
    if !info.product_name.starts_with(product.name()) {
        let e = AttestError::Chain(format!(
            "the VCEK is for product '{}', the chain is {}'s",
            info.product_name,
            product.name()
        ));
        return Err(log.fail("VCEK product", e));
    }
    log.pass("VCEK product", info.product_name.clone());
    let tcb = product.tcb(report.reported_tcb);
    let r = info.matches(product, &report.chip_id, &tcb).map_err(AttestError::Chain);
    log.record("chip id and reported TCB match the VCEK", r, |_| {
        format!("chip {}…, TCB {tcb}", hex::encode(&report.chip_id[..8]))
    })?;
    Ok(tcb)
}

impl SnpVerifier {
    /// A verifier with this policy, trust anchors and VCEK/CRL collateral.
    pub fn new(policy: SnpPolicy, anchors: SnpTrustAnchors, collateral: Arc<SnpCollateral>) -> SnpVerifier {
        SnpVerifier { policy, anchors, collateral }
    }

    /// The policy it checks reports against.
    pub fn policy(&self) -> &SnpPolicy {
        &self.policy
    }

    /// Checks the report and its certificates (steps 1 to 6 of the module docs) and records
    /// each check; the report data is left to the caller.
    pub fn verify_report(
        &self,
        report: &SnpReport,
        certs: &[TableEntry],
        log: &mut CheckLog,
    ) -> Result<SnpVerified, AttestError> {
        let t = self.policy.time.unix_secs();
        log.pass(
            "format",
            format!(
                "SEV-SNP report version {}, VMPL {}, guest policy {:#x}, signature ECDSA P-384/SHA-384",
                report.version, report.vmpl, report.policy
            ),
        );
        if report.chip_key_masked() || report.signing_key() != 0 {
            let e = AttestError::Policy(format!(
                "the report is signed by key {} (0 = VCEK) with the chip key {}: only VCEK-signed reports are accepted",
                report.signing_key(),
                if report.chip_key_masked() { "masked" } else { "not masked" }
            ));
            return Err(log.fail("signing key", e));
        }
        log.pass("signing key", "VCEK (the chip's versioned endorsement key)");
        // Certificates the evidence carries.
        let get = |g: [u8; 16]| certs.iter().find(|e| e.guid == g).map(|e| e.data.as_slice());
        let ev_ark = get(GUID_ARK);
        let ev_ask = get(GUID_ASK).map(Cert::from_der).transpose().map_err(|e| log.fail("ASK", e))?;
        let ev_vcek = get(GUID_VCEK);
        // The trust anchor: the evidence's ARK (if any) must be one of them.
        let candidates: Vec<&(Product, Cert)> = match ev_ark {
            Some(der) => {
                let Some(a) = self.anchors.anchors.iter().find(|(_, c)| c.der == der) else {
                    let e = AttestError::Chain("the evidence's ARK is not one of the trust anchors".into());
                    return Err(log.fail("ARK (trust anchor)", e));
                };
                vec![a]
            }
            None => self.anchors.anchors.iter().collect(),
        };
        // The VCEK: the evidence's, else one from the cache for this chip.
        let vcek_der = match ev_vcek {
            Some(v) => v.to_vec(),
            None => self.cached_vcek(report, &candidates, log)?,
        };
        let vcek = Cert::from_der(&vcek_der).map_err(|e| log.fail("VCEK", e))?;
        // The ASK that issued it (the evidence's, else a known one) and the ARK over that.
        let asks: Vec<Cert> = match ev_ask {
            Some(a) => vec![a],
            None => self.anchors.known_asks.clone(),
        };
        let Some(ask) = asks.iter().find(|a| a.x.tbs_certificate().subject() == vcek.x.tbs_certificate().issuer())
        else {
            let e = AttestError::Chain(format!(
                "no ASK named '{}' (the VCEK's issuer) in the evidence or known",
                vcek.x.tbs_certificate().issuer()
            ));
            return Err(log.fail("ASK", e));
        };
        let Some((product, ark)) = candidates
            .iter()
            .find(|(_, ark)| ask.x.tbs_certificate().issuer() == ark.x.tbs_certificate().subject())
            .map(|(p, c)| (*p, c))
        else {
            let e = AttestError::Chain(format!(
                "the ASK '{}' is issued by '{}', which is not a trust anchor",
                ask.cn(),
                ask.x.tbs_certificate().issuer()
            ));
            return Err(log.fail("ARK (trust anchor)", e));
        };
        log.record("ARK (trust anchor)", ark.check_validity(t, "the ARK"), |_| {
            format!("{} (product line {}), valid at {}", ark.cn(), product.name(), crate::attest::fmt_utc(t))
        })?;
        let r = ask.check_signed_by(ark, "ASK").and_then(|()| ask.check_validity(t, "the ASK"));
        log.record("ASK signed by the ARK", r, |_| format!("{}, RSASSA-PSS/SHA-384, valid", ask.cn()))?;
        self.check_crl(product, ark, ask, t, log)?;
        let r = vcek.check_signed_by(ask, "VCEK").and_then(|()| vcek.check_validity(t, "the VCEK"));
        log.record("VCEK signed by the ASK", r, |_| format!("{}, RSASSA-PSS/SHA-384, valid", vcek.cn()))?;
        let tcb = check_vcek_info(&vcek, product, report, log)?;
        // The report's signature.
        let r = check_report_signature(report, &vcek);
        log.record("report signature", r, |_| "ECDSA P-384/SHA-384 under the VCEK".into())?;
        self.check_policy(report, product, &tcb, log)?;
        let measurement = self.check_measurement(report, log)?;
        if ev_vcek.is_some() {
            self.collateral.add_vcek(&vcek.der);
        }
        Ok(SnpVerified { product, tcb, measurement, report_data: report.report_data })
    }

    /// A VCEK from the cache for the report's chip and TCB under one of `candidates`' product
    /// lines (the evidence carries none), or an error naming where to fetch one.
    fn cached_vcek(
        &self,
        report: &SnpReport,
        candidates: &[&(Product, Cert)],
        log: &mut CheckLog,
    ) -> Result<Vec<u8>, AttestError> {
        let found = self.collateral.vceks().into_iter().find(|d| {
            Cert::from_der(d).ok().and_then(|c| VcekInfo::from_cert(&c).ok()).is_some_and(|i| {
                candidates.iter().any(|(p, _)| i.matches(*p, &report.chip_id, &p.tcb(report.reported_tcb)).is_ok())
            })
        });
        match found {
            Some(d) => Ok(d),
            None => {
                let urls: Vec<String> = candidates.iter().map(|(p, _)| kds_vcek_url(*p, report)).collect();
                let e = AttestError::Collateral(format!(
                    "no VCEK for chip {}… at TCB {:#018x}: the evidence carries none and the cache has none \
                     (fetch it from {} and put it in the VCEK cache directory)",
                    hex::encode(&report.chip_id[..8]),
                    report.reported_tcb,
                    urls.join(" or ")
                ));
                Err(log.fail("VCEK", e))
            }
        }
    }

    /// Checks the report's launch measurement (with its guest policy, or with any) is allowed.
    fn check_measurement(&self, report: &SnpReport, log: &mut CheckLog) -> Result<Measurement, AttestError> {
        let digests = report_measurements(report);
        let Some(measurement) = digests.iter().find(|d| self.policy.allowed.allowed.contains(d)).copied() else {
            let e = AttestError::Measurement(format!(
                "{} (launch measurement {} with guest policy {:#x})",
                digests[0].short(),
                hex::encode(report.measurement),
                report.policy
            ));
            return Err(log.fail("measurement", e));
        };
        log.pass(
            "measurement",
            format!(
                "launch measurement {} {} is allowed",
                hex::encode(report.measurement),
                if measurement == digests[0] { "with this guest policy" } else { "(any guest policy)" }
            ),
        );
        Ok(measurement)
    }

    fn check_crl(
        &self,
        product: Product,
        ark: &Cert,
        ask: &Cert,
        t: u64,
        log: &mut CheckLog,
    ) -> Result<(), AttestError> {
        let name = "ASK not revoked (CRL)";
        let ark_subject = ark.x.tbs_certificate().subject();
        let mut found = false;
        for der in &self.collateral.crls {
            let Ok(crl) = x509_cert::crl::CertificateList::<x509_cert::certificate::Rfc5280>::from_der(der) else {
                return Err(log.fail(name, AttestError::Collateral("a CRL of the cache does not parse".into())));
            };
            if &crl.tbs_cert_list.issuer != ark_subject {
                continue;
            }
            found = true;
            let r = check_rsa_pss(
                der,
                &crl.signature_algorithm,
                &crl.tbs_cert_list.signature,
                &crl.signature,
                ark,
                &format!("the {} CRL", product.name()),
            );
            r.map_err(|e| log.fail(name, e))?;
            let this = crl.tbs_cert_list.this_update.to_unix_duration().as_secs();
            let next = crl.tbs_cert_list.next_update.map(|n| n.to_unix_duration().as_secs());
            if t < this || next.is_some_and(|n| t > n) {
                let e = AttestError::Collateral(format!(
                    "the {} CRL is valid from {} to {}, not at {}",
                    product.name(),
                    crate::attest::fmt_utc(this),
                    next.map(crate::attest::fmt_utc).unwrap_or_else(|| "(no next update)".into()),
                    crate::attest::fmt_utc(t)
                ));
                return Err(log.fail(name, e));
            }
            if let Some(max) = self.policy.crl_max_age_secs {
                if t - this > max {
                    let e = AttestError::Collateral(format!(
                        "the {} CRL was issued {} s before the verification time, over the policy's {max} s",
                        product.name(),
                        t - this
                    ));
                    return Err(log.fail(name, e));
                }
            }
            let serial = ask.x.tbs_certificate().serial_number();
            let revoked = crl.tbs_cert_list.revoked_certificates.iter().flatten().any(|r| &r.serial_number == serial);
            if revoked {
                let e = AttestError::Chain(format!("the ASK {} is revoked by the {} CRL", ask.cn(), product.name()));
                return Err(log.fail(name, e));
            }
            log.pass(
                name,
                format!(
                    "{} CRL of {} (signed by the ARK) does not list it",
                    product.name(),
                    crate::attest::fmt_utc(this)
                ),
            );
        }
        if !found {
            if self.policy.require_crl {
                let e = AttestError::Collateral(format!(
                    "no {} CRL known and the policy requires one (fetch https://kdsintf.amd.com/vcek/v1/{}/crl)",
                    product.name(),
                    product.name()
                ));
                return Err(log.fail(name, e));
            }
            log.skip(name, format!("no {} CRL known (the policy does not require one)", product.name()));
        }
        Ok(())
    }

    fn check_policy(&self, r: &SnpReport, product: Product, tcb: &Tcb, log: &mut CheckLog) -> Result<(), AttestError> {
        let p = &self.policy;
        if r.policy & POLICY_DEBUG != 0 && !p.allow_debug {
            return Err(log.fail("debug", AttestError::Policy("the guest policy allows debugging".into())));
        }
        log.pass(
            "debug",
            if r.policy & POLICY_DEBUG != 0 { "allowed by the policy" } else { "the guest cannot be debugged" },
        );
        if (r.policy & POLICY_MIGRATE_MA != 0 || r.has_migration_agent()) && !p.allow_migration_agent {
            let e = AttestError::Policy(format!(
                "a migration agent is {} (guest policy bit 18 {}, REPORT_ID_MA {})",
                if r.has_migration_agent() { "bound to the guest" } else { "allowed" },
                r.policy & POLICY_MIGRATE_MA != 0,
                hex::encode(&r.report_id_ma[..8])
            ));
            return Err(log.fail("migration agent", e));
        }
        log.pass("migration agent", "none allowed, none bound");
        if !p.vmpls.contains(&r.vmpl) {
            let e = AttestError::Policy(format!("VMPL {} is not one of the accepted {:?}", r.vmpl, p.vmpls));
            return Err(log.fail("VMPL", e));
        }
        log.pass("VMPL", format!("{} (accepted: {:?})", r.vmpl, p.vmpls));
        if !p.allow_smt && r.platform_info & PLATFORM_SMT_EN != 0 {
            return Err(log.fail("SMT", AttestError::Policy("SMT is enabled on the platform".into())));
        }
        log.pass("SMT", if r.platform_info & PLATFORM_SMT_EN != 0 { "enabled, accepted" } else { "disabled" });
        let m = &p.min_tcb;
        let mut low = Vec::new();
        for (name, have, min) in [
            ("bootloader", tcb.bootloader, m.bootloader),
            ("tee", tcb.tee, m.tee),
            ("snp", tcb.snp, m.snp),
            ("microcode", tcb.microcode, m.microcode),
        ] {
            if have < min {
                low.push(format!("{name} {have} < {min}"));
            }
        }
        if product == Product::Turin && tcb.fmc.unwrap_or(0) < m.fmc {
            low.push(format!("fmc {} < {}", tcb.fmc.unwrap_or(0), m.fmc));
        }
        if !low.is_empty() {
            let e = AttestError::Policy(format!("reported TCB below the policy's minimum: {}", low.join(", ")));
            return Err(log.fail("minimum TCB", e));
        }
        log.pass("minimum TCB", format!("reported TCB ({tcb}) at or above the minimum"));
        if r.guest_svn < p.min_guest_svn {
            let e = AttestError::Policy(format!("guest SVN {} < {}", r.guest_svn, p.min_guest_svn));
            return Err(log.fail("guest SVN", e));
        }
        log.pass("guest SVN", format!("{} (minimum {})", r.guest_svn, p.min_guest_svn));
        Ok(())
    }
}

/// Where AMD's key distribution service serves the VCEK of this report's chip and TCB.
pub fn kds_vcek_url(product: Product, r: &SnpReport) -> String {
    let tcb = product.tcb(r.reported_tcb);
    let hwid = match product {
        Product::Turin => hex::encode(&r.chip_id[..8]),
        _ => hex::encode(r.chip_id),
    };
    let fmc = tcb.fmc.map(|f| format!("fmcSPL={f}&")).unwrap_or_default();
    format!(
        "https://kdsintf.amd.com/vcek/v1/{}/{hwid}?{fmc}blSPL={}&teeSPL={}&snpSPL={}&ucodeSPL={}",
        product.name(),
        tcb.bootloader,
        tcb.tee,
        tcb.snp,
        tcb.microcode
    )
}

/// The report's ECDSA P-384 signature under the VCEK's public key.
fn check_report_signature(r: &SnpReport, vcek: &Cert) -> Result<(), AttestError> {
    use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P384_SHA384_FIXED};
    let spki = vcek.x.tbs_certificate().subject_public_key_info();
    let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
    if spki.algorithm.oid != OID_EC_PUBLIC_KEY || curve != Some(OID_SECP384R1) {
        return Err(AttestError::Chain("the VCEK's key is not an ECDSA P-384 key".into()));
    }
    UnparsedPublicKey::new(&ECDSA_P384_SHA384_FIXED, spki.subject_public_key.raw_bytes())
        .verify(&r.raw[..SIGNED_LEN], &r.signature_fixed())
        .map_err(|_| AttestError::Signature)
}

impl AttestVerifier for SnpVerifier {
    fn verify_explained(
        &self,
        evidence: &Evidence,
        expect: &Expected,
        log: &mut CheckLog,
    ) -> Result<VerifiedReport, AttestError> {
        if evidence.backend != SNP_BACKEND {
            return Err(log.fail("backend", AttestError::Backend { got: evidence.backend, want: SNP_BACKEND }));
        }
        let (report, certs) = decode_evidence(&evidence.bytes).map_err(|e| log.fail("format", e))?;
        let v = self.verify_report(&report, &certs, log)?;
        let data = check_report_data(&v.report_data, expect, log)?;
        tracing::debug!(product = v.product.name(), measurement = %v.measurement.short(), "snp report verified");
        Ok(VerifiedReport { kind: TeeKind::Snp, measurement: v.measurement, report_data: data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_amd_roots_are_self_signed_and_name_their_product() {
        let a = SnpTrustAnchors::from_ders(&[AMD_ARK_MILAN.to_vec(), AMD_ARK_GENOA.to_vec(), AMD_ARK_TURIN.to_vec()])
            .unwrap();
        assert_eq!(a.products(), vec![Product::Milan, Product::Genoa, Product::Turin]);
        let amd = SnpTrustAnchors::amd();
        for (ask, (_, ark)) in amd.known_asks.iter().zip(&amd.anchors) {
            ask.check_signed_by(ark, "ASK").unwrap();
        }
        // An ASK is not its own root.
        assert!(amd.known_asks[0].check_signed_by(&amd.known_asks[0], "x").is_err());
    }

    #[test]
    fn cert_table_round_trips_and_is_bounded() {
        let e =
            vec![TableEntry { guid: GUID_VCEK, data: vec![1, 2, 3] }, TableEntry { guid: GUID_ASK, data: vec![4; 10] }];
        let t = encode_cert_table(&e);
        assert_eq!(parse_cert_table(&t).unwrap(), e);
        let mut bad = t.clone();
        bad[16] = 0xff; // offset out of range
        assert!(parse_cert_table(&bad).is_err());
        assert!(parse_cert_table(&t[..30]).is_err());
        assert!(parse_cert_table(&[]).is_err());
        // The GUID strings of the GHCB specification.
        assert_eq!(hex::encode(GUID_VCEK), "63da758de6644564adc5f4b93be8accd");
        assert_eq!(hex::encode(GUID_ARK), "c0b406a4a80349529743 3fb6014cd0ae".replace(' ', ""));
    }

    #[test]
    fn tcb_layouts() {
        let raw = u64::from_le_bytes([3, 0, 0, 0, 0, 0, 8, 0x73]);
        let t = Product::Milan.tcb(raw);
        assert_eq!((t.bootloader, t.tee, t.snp, t.microcode, t.fmc), (3, 0, 8, 0x73, None));
        let t = Product::Turin.tcb(u64::from_le_bytes([1, 2, 3, 4, 0, 0, 0, 9]));
        assert_eq!((t.fmc, t.bootloader, t.tee, t.snp, t.microcode), (Some(1), 2, 3, 4, 9));
    }
}

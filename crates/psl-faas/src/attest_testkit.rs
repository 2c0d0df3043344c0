//! Test support (feature `testkit`): hardware evidence without the hardware.
//!
//! - [`TestAmd`]: a private PKI shaped like AMD's (an `ARK-<product>` root and an `SEV-<product>`
//!   intermediate, RSA with RSASSA-PSS/SHA-384, a P-384 VCEK carrying the chip id and TCB in
//!   AMD's extensions) that signs SEV-SNP-format reports. A verifier given its ARK as trust
//!   anchor ([`crate::attest_snp::SnpTrustAnchors::from_ders`]) runs the real SNP verification
//!   on them.
//! - [`FakeTsm`]: a directory tree that behaves like configfs-tsm for one report entry: `outblob`
//!   and `auxblob` are FIFOs served by a thread that reads `inblob` when the attester opens
//!   `outblob`, answers with a report over it and moves `generation`; faults (generation moved by
//!   another writer) on request.
//! - [`FakeGramine`]: the same for Gramine's `/dev/attestation` (`quote` is the FIFO).
//!
//! Only the evidence source is fake: the attesters and verifiers are the production code.

use crate::attest_snp::{encode_cert_table, Product, TableEntry, GUID_ARK, GUID_ASK, GUID_VCEK, SNP_REPORT_LEN};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair, RsaKeyPair, ECDSA_P384_SHA384_FIXED_SIGNING, RSA_PSS_SHA384};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A DER element.
pub fn der(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    let n = body.len();
    if n < 0x80 {
        v.push(n as u8);
    } else if n < 0x100 {
        v.extend_from_slice(&[0x81, n as u8]);
    } else if n < 0x10000 {
        v.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]);
    } else {
        v.extend_from_slice(&[0x83, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
    }
    v.extend_from_slice(body);
    v
}

fn seq(parts: &[&[u8]]) -> Vec<u8> {
    der(0x30, &parts.concat())
}

/// An OBJECT IDENTIFIER from its dotted form.
pub fn oid(dotted: &str) -> Vec<u8> {
    let arcs: Vec<u64> = dotted.split('.').map(|a| a.parse().expect("numeric arc")).collect();
    let mut body = vec![(arcs[0] * 40 + arcs[1]) as u8];
    for &a in &arcs[2..] {
        let mut tmp = vec![(a & 0x7f) as u8];
        let mut x = a >> 7;
        while x > 0 {
            tmp.push(0x80 | (x & 0x7f) as u8);
            x >>= 7;
        }
        tmp.reverse();
        body.extend_from_slice(&tmp);
    }
    der(0x06, &body)
}

fn int_u(v: &[u8]) -> Vec<u8> {
    let mut b: Vec<u8> = v.iter().copied().skip_while(|x| *x == 0).collect();
    if b.is_empty() || b[0] & 0x80 != 0 {
        b.insert(0, 0);
    }
    der(0x02, &b)
}

/// RSASSA-PSS with SHA-384, MGF1-SHA-384, salt 48 (AMD's parameters).
fn pss_alg() -> Vec<u8> {
    let sha384 = seq(&[&oid("2.16.840.1.101.3.4.2.2"), &[0x05, 0x00]]);
    let mgf = seq(&[&oid("1.2.840.113549.1.1.8"), &sha384]);
    let params = seq(&[&der(0xa0, &sha384), &der(0xa1, &mgf), &der(0xa2, &int_u(&[48]))]);
    seq(&[&oid("1.2.840.113549.1.1.10"), &params])
}

fn name(cn: &str) -> Vec<u8> {
    let attr = |o: &str, v: &str, tag: u8| der(0x31, &seq(&[&oid(o), &der(tag, v.as_bytes())]));
    seq(&[
        &attr("2.5.4.11", "Engineering", 0x0c),
        &attr("2.5.4.6", "US", 0x13),
        &attr("2.5.4.7", "Santa Clara", 0x0c),
        &attr("2.5.4.8", "CA", 0x0c),
        &attr("2.5.4.10", "PSL test PKI (not AMD)", 0x0c),
        &attr("2.5.4.3", cn, 0x0c),
    ])
}

/// UTCTime or GeneralizedTime for Unix seconds.
fn time(t: u64) -> Vec<u8> {
    let s = crate::attest::fmt_utc(t); // 2025-06-20T00:00:00Z
    let digits: String = s.chars().filter(|c| c.is_ascii_digit()).collect();
    let year: u32 = s[..4].parse().expect("year");
    if (1950..2050).contains(&year) {
        der(0x17, format!("{}Z", &digits[2..]).as_bytes())
    } else {
        der(0x18, format!("{digits}Z").as_bytes())
    }
}

fn rsa_spki(kp: &RsaKeyPair) -> Vec<u8> {
    let mut bits = vec![0u8];
    bits.extend_from_slice(kp.public_key().as_ref());
    seq(&[&seq(&[&oid("1.2.840.113549.1.1.1"), &[0x05, 0x00]]), &der(0x03, &bits)])
}

fn ec_spki(kp: &EcdsaKeyPair) -> Vec<u8> {
    let mut bits = vec![0u8];
    bits.extend_from_slice(kp.public_key().as_ref());
    seq(&[&seq(&[&oid("1.2.840.10045.2.1"), &oid("1.3.132.0.34")]), &der(0x03, &bits)])
}

fn sign_rsa(kp: &RsaKeyPair, msg: &[u8]) -> Vec<u8> {
    let mut sig = vec![0u8; kp.public_modulus_len()];
    kp.sign(&RSA_PSS_SHA384, &SystemRandom::new(), msg, &mut sig).expect("RSA-PSS signing");
    sig
}

/// A certificate signed by `signer` (RSASSA-PSS/SHA-384).
#[allow(clippy::too_many_arguments)]
pub fn rsa_signed_cert(
    serial: u64,
    issuer_cn: &str,
    subject_cn: &str,
    not_before: u64,
    not_after: u64,
    spki: &[u8],
    extensions: &[Vec<u8>],
    signer: &RsaKeyPair,
) -> Vec<u8> {
    let mut tbs_parts: Vec<Vec<u8>> = vec![
        der(0xa0, &int_u(&[2])),
        int_u(&serial.to_be_bytes()),
        pss_alg(),
        name(issuer_cn),
        seq(&[&time(not_before), &time(not_after)]),
        name(subject_cn),
        spki.to_vec(),
    ];
    if !extensions.is_empty() {
        tbs_parts.push(der(0xa3, &der(0x30, &extensions.concat())));
    }
    let tbs = der(0x30, &tbs_parts.concat());
    let sig = sign_rsa(signer, &tbs);
    let mut bits = vec![0u8];
    bits.extend_from_slice(&sig);
    seq(&[&tbs, &pss_alg(), &der(0x03, &bits)])
}

fn ext(o: &str, value: &[u8]) -> Vec<u8> {
    seq(&[&oid(o), &der(0x04, value)])
}

/// The VCEK extensions for `chip_id` at TCB `tcb` (Milan/Genoa layout unless Turin).
pub fn vcek_extensions(product: Product, chip_id: &[u8; 64], tcb: u64) -> Vec<Vec<u8>> {
    let t = product.tcb(tcb);
    let spl = |v: u8| int_u(&[v]);
    let base = "1.3.6.1.4.1.3704.1";
    let mut e = vec![
        ext(&format!("{base}.1"), &int_u(&[0])),
        ext(&format!("{base}.2"), &der(0x16, format!("{}-B0", product.name()).as_bytes())),
        ext(&format!("{base}.3.1"), &spl(t.bootloader)),
        ext(&format!("{base}.3.2"), &spl(t.tee)),
        ext(&format!("{base}.3.4"), &spl(t.reserved[0])),
        ext(&format!("{base}.3.5"), &spl(t.reserved[1])),
        ext(&format!("{base}.3.6"), &spl(t.reserved[2])),
        ext(&format!("{base}.3.7"), &spl(t.reserved[3])),
        ext(&format!("{base}.3.3"), &spl(t.snp)),
        ext(&format!("{base}.3.8"), &spl(t.microcode)),
    ];
    if let Some(f) = t.fmc {
        e.push(ext(&format!("{base}.3.9"), &spl(f)));
    }
    let hw: &[u8] = if product == Product::Turin { &chip_id[..8] } else { &chip_id[..] };
    e.push(ext(&format!("{base}.4"), hw));
    e
}

/// 2020-01-01 and 2045-01-01: the test PKI's validity.
pub const PKI_NOT_BEFORE: u64 = 1_577_836_800;
/// End of the test PKI's validity (2045-01-01, Unix seconds).
pub const PKI_NOT_AFTER: u64 = 2_366_841_600;

/// A private AMD-shaped PKI for one product line.
pub struct TestAmd {
    /// The product line the PKI stands in for.
    pub product: Product,
    /// The test ARK's private key (RSA-2048).
    pub ark_key: RsaKeyPair,
    /// The test ARK's self-signed certificate (DER).
    pub ark_der: Vec<u8>,
    /// The test ASK's private key (RSA-2048).
    pub ask_key: RsaKeyPair,
    /// The test ASK's certificate, signed by the ARK (DER).
    pub ask_der: Vec<u8>,
}

impl TestAmd {
    /// Generates an ARK and an ASK (RSA-2048: faster than AMD's 4096, same algorithms).
    pub fn new(product: Product) -> TestAmd {
        let ark_key = RsaKeyPair::generate(KeySize::Rsa2048).expect("RSA key");
        let ask_key = RsaKeyPair::generate(KeySize::Rsa2048).expect("RSA key");
        let p = product.name();
        let ark_der = rsa_signed_cert(
            1,
            &format!("ARK-{p}"),
            &format!("ARK-{p}"),
            PKI_NOT_BEFORE,
            PKI_NOT_AFTER,
            &rsa_spki(&ark_key),
            &[],
            &ark_key,
        );
        let ask_der = rsa_signed_cert(
            2,
            &format!("ARK-{p}"),
            &format!("SEV-{p}"),
            PKI_NOT_BEFORE,
            PKI_NOT_AFTER,
            &rsa_spki(&ask_key),
            &[],
            &ark_key,
        );
        TestAmd { product, ark_key, ark_der, ask_key, ask_der }
    }

    /// A VCEK for `chip_id` at `tcb`, valid from `not_before` to `not_after`.
    pub fn vcek(&self, chip_id: &[u8; 64], tcb: u64, not_before: u64, not_after: u64) -> TestVcek {
        let key = EcdsaKeyPair::generate(&ECDSA_P384_SHA384_FIXED_SIGNING).expect("P-384 key");
        let der = rsa_signed_cert(
            0,
            &format!("SEV-{}", self.product.name()),
            "SEV-VCEK",
            not_before,
            not_after,
            &ec_spki(&key),
            &vcek_extensions(self.product, chip_id, tcb),
            &self.ask_key,
        );
        TestVcek { key, der, chip_id: *chip_id, tcb }
    }

    /// A CRL of the ARK revoking `serials`, valid from `this` to `next`.
    pub fn crl(&self, serials: &[u64], this: u64, next: u64) -> Vec<u8> {
        let mut tbs_parts =
            vec![int_u(&[1]), pss_alg(), name(&format!("ARK-{}", self.product.name())), time(this), time(next)];
        if !serials.is_empty() {
            let revoked: Vec<u8> = serials.iter().flat_map(|s| seq(&[&int_u(&s.to_be_bytes()), &time(this)])).collect();
            tbs_parts.push(der(0x30, &revoked));
        }
        let tbs = der(0x30, &tbs_parts.concat());
        let sig = sign_rsa(&self.ark_key, &tbs);
        let mut bits = vec![0u8];
        bits.extend_from_slice(&sig);
        seq(&[&tbs, &pss_alg(), &der(0x03, &bits)])
    }

    /// The ARK as PEM (for a policy's `trust_anchors`).
    pub fn ark_pem(&self) -> String {
        pem::encode(&pem::Pem::new("CERTIFICATE", self.ark_der.clone()))
    }
}

/// A test VCEK and its private key.
pub struct TestVcek {
    /// The VCEK's private key (ECDSA P-384): it signs the test reports.
    pub key: EcdsaKeyPair,
    /// The VCEK's certificate, signed by the test ASK (DER).
    pub der: Vec<u8>,
    /// The chip id the VCEK is issued for (put in its reports).
    pub chip_id: [u8; 64],
    /// The reported TCB the VCEK is issued for (raw TCB version).
    pub tcb: u64,
}

/// The fields of a test report.
#[derive(Clone, Debug)]
pub struct ReportSpec {
    /// Report format version (default 3).
    pub version: u32,
    /// Guest SVN (default 1).
    pub guest_svn: u32,
    /// Guest policy (default 0x30000: SMT allowed, reserved bit set).
    pub policy: u64,
    /// VMPL of the requester (default 0).
    pub vmpl: u32,
    /// Platform information bits (default 1: SMT enabled).
    pub platform_info: u64,
    /// Launch measurement.
    pub measurement: [u8; 48],
    /// Report data (the verifier's binding; the fake TSM overwrites it with `inblob`).
    pub report_data: [u8; 64],
    /// Migration agent's report id (default all ones: none).
    pub report_id_ma: [u8; 32],
}

impl Default for ReportSpec {
    fn default() -> Self {
        ReportSpec {
            version: 3,
            guest_svn: 1,
            policy: 0x30000,
            vmpl: 0,
            platform_info: 1,
            measurement: [0x4d; 48],
            report_data: [0; 64],
            report_id_ma: [0xff; 32],
        }
    }
}

impl TestVcek {
    /// An attestation report with `spec`, this VCEK's chip id and TCB, signed by it.
    pub fn report(&self, spec: &ReportSpec) -> Vec<u8> {
        let mut b = vec![0u8; SNP_REPORT_LEN];
        b[0..4].copy_from_slice(&spec.version.to_le_bytes());
        b[4..8].copy_from_slice(&spec.guest_svn.to_le_bytes());
        b[8..16].copy_from_slice(&spec.policy.to_le_bytes());
        b[0x30..0x34].copy_from_slice(&spec.vmpl.to_le_bytes());
        b[0x34..0x38].copy_from_slice(&1u32.to_le_bytes());
        b[0x38..0x40].copy_from_slice(&self.tcb.to_le_bytes());
        b[0x40..0x48].copy_from_slice(&spec.platform_info.to_le_bytes());
        b[0x50..0x90].copy_from_slice(&spec.report_data);
        b[0x90..0xC0].copy_from_slice(&spec.measurement);
        b[0x140..0x160].copy_from_slice(&[0x11; 32]);
        b[0x160..0x180].copy_from_slice(&spec.report_id_ma);
        b[0x180..0x188].copy_from_slice(&self.tcb.to_le_bytes());
        b[0x1A0..0x1E0].copy_from_slice(&self.chip_id);
        b[0x1E0..0x1E8].copy_from_slice(&self.tcb.to_le_bytes());
        b[0x1F0..0x1F8].copy_from_slice(&self.tcb.to_le_bytes());
        self.sign(&mut b);
        b
    }

    /// (Re-)signs a report's first 0x2A0 bytes with this VCEK.
    pub fn sign(&self, b: &mut [u8]) {
        let sig = self.key.sign(&SystemRandom::new(), &b[..0x2A0]).expect("ECDSA signing");
        let sig = sig.as_ref();
        for i in 0..48 {
            b[0x2A0 + i] = sig[47 - i];
            b[0x2E8 + i] = sig[95 - i];
        }
    }
}

/// The certificate table a host would give (VCEK, ASK, ARK).
pub fn cert_table(amd: &TestAmd, vcek: &TestVcek) -> Vec<u8> {
    encode_cert_table(&[
        TableEntry { guid: GUID_VCEK, data: vcek.der.clone() },
        TableEntry { guid: GUID_ASK, data: amd.ask_der.clone() },
        TableEntry { guid: GUID_ARK, data: amd.ark_der.clone() },
    ])
}

/// A FIFO at `p`.
fn mkfifo(p: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("no NUL in path");
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call; mkfifo only reads it.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "mkfifo {}: {}", p.display(), std::io::Error::last_os_error());
}

/// What a fake entry does wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TsmFault {
    /// Reports are served faithfully.
    None,
    /// Another writer: the generation moves by two during each report.
    GenerationJump,
}

/// Makes the `outblob` (and for SNP the `auxblob`) of a report over the 64 bytes of `inblob`.
pub type ReportFn = dyn Fn(&[u8; 64]) -> (Vec<u8>, Vec<u8>) + Send + Sync;

/// A configfs-tsm tree with one report entry served by a thread. `inblob`, `outblob` and (SNP)
/// `auxblob` are FIFOs, so the thread sees each write of `inblob` (and moves `generation`, as
/// the kernel does) and answers the read of `outblob` that follows.
pub struct FakeTsm {
    /// The configfs-tsm root directory (what `TsmAttester` is pointed at).
    pub root: PathBuf,
    /// The report entry's name under `report/`.
    pub entry: String,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Reads a FIFO to its end (the writer closed), bounded.
fn read_fifo(p: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(p).ok()?;
    let mut b = Vec::new();
    f.take(1 << 20).read_to_end(&mut b).ok()?;
    Some(b)
}

/// Writes `data` to a FIFO once a reader opens it.
fn write_fifo(p: &Path, data: &[u8]) -> bool {
    use std::io::Write;
    match std::fs::OpenOptions::new().write(true).open(p) {
        Ok(mut f) => {
            let _ = f.write_all(data);
            true
        }
        Err(_) => false,
    }
}

fn first_64(b: &[u8]) -> [u8; 64] {
    let mut x = [0u8; 64];
    let n = b.len().min(64);
    x[..n].copy_from_slice(&b[..n]);
    x
}

/// Unblocks a thread waiting to open FIFO `p` (for reading or for writing).
fn unblock(p: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(p);
    let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(p);
}

impl FakeTsm {
    /// `root/report/<entry>/` with provider `provider` (`sev_guest`, `tdx_guest`, or anything
    /// for the mismatch tests); `make` answers each report.
    pub fn start(root: &Path, entry: &str, provider: &str, fault: TsmFault, make: Arc<ReportFn>) -> FakeTsm {
        let dir = root.join("report").join(entry);
        std::fs::create_dir_all(&dir).expect("fake configfs entry");
        std::fs::write(dir.join("provider"), format!("{provider}\n")).expect("provider");
        std::fs::write(dir.join("generation"), "0\n").expect("generation");
        std::fs::write(dir.join("privlevel_floor"), "0\n").expect("privlevel_floor");
        mkfifo(&dir.join("inblob"));
        mkfifo(&dir.join("outblob"));
        let snp = provider == "sev_guest";
        if snp {
            mkfifo(&dir.join("auxblob"));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let (st, sv, d) = (stop.clone(), served.clone(), dir.clone());
        let thread = std::thread::Builder::new()
            .name("fake-configfs-tsm".into())
            .spawn(move || {
                let mut gen = 0u64;
                loop {
                    // A write of inblob (blocks until the attester writes).
                    let inblob = read_fifo(&d.join("inblob"));
                    if st.load(Ordering::SeqCst) {
                        return;
                    }
                    let Some(inblob) = inblob else { return };
                    gen += if fault == TsmFault::GenerationJump { 2 } else { 1 };
                    let _ = std::fs::write(d.join("generation"), format!("{gen}\n"));
                    let (o, a) = make(&first_64(&inblob));
                    if !write_fifo(&d.join("outblob"), &o) || st.load(Ordering::SeqCst) {
                        return;
                    }
                    if snp && (!write_fifo(&d.join("auxblob"), &a) || st.load(Ordering::SeqCst)) {
                        return;
                    }
                    sv.fetch_add(1, Ordering::SeqCst);
                }
            })
            .expect("spawning the fake configfs thread");
        FakeTsm { root: root.to_path_buf(), entry: entry.into(), stop, served, thread: Some(thread) }
    }

    /// Reports served so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for FakeTsm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let d = self.root.join("report").join(&self.entry);
        if let Some(t) = self.thread.take() {
            while !t.is_finished() {
                for f in ["inblob", "outblob", "auxblob"] {
                    unblock(&d.join(f));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let _ = t.join();
        }
    }
}

/// Makes the quote over 64 bytes of user report data.
pub type QuoteMaker = Arc<dyn Fn(&[u8; 64]) -> Vec<u8> + Send + Sync>;

/// Gramine's `/dev/attestation` with DCAP, served by a thread (`user_report_data` and `quote`
/// are FIFOs).
pub struct FakeGramine {
    /// The directory standing in for `/dev/attestation`.
    pub dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeGramine {
    /// `make` returns the quote for the 64 bytes written to `user_report_data`.
    pub fn start(dir: &Path, make: QuoteMaker) -> FakeGramine {
        std::fs::create_dir_all(dir).expect("fake /dev/attestation");
        std::fs::write(dir.join("attestation_type"), "dcap").expect("attestation_type");
        mkfifo(&dir.join("user_report_data"));
        mkfifo(&dir.join("quote"));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, d) = (stop.clone(), dir.to_path_buf());
        let thread = std::thread::Builder::new()
            .name("fake-gramine".into())
            .spawn(move || loop {
                let urd = read_fifo(&d.join("user_report_data"));
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Some(urd) = urd else { return };
                if !write_fifo(&d.join("quote"), &make(&first_64(&urd))) || st.load(Ordering::SeqCst) {
                    return;
                }
            })
            .expect("spawning the fake Gramine thread");
        FakeGramine { dir: dir.to_path_buf(), stop, thread: Some(thread) }
    }
}

impl Drop for FakeGramine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            while !t.is_finished() {
                for f in ["user_report_data", "quote"] {
                    unblock(&self.dir.join(f));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let _ = t.join();
        }
    }
}

/// A fake SEV-SNP platform: the PKI, one chip's VCEK, and the `outblob`/`auxblob` maker of a
/// [`FakeTsm`] that signs a report over whatever `inblob` holds. `tamper` alters each report
/// after signing (to test that the verifier refuses it).
pub struct FakeSnpPlatform {
    /// The private AMD PKI (Milan).
    pub amd: TestAmd,
    /// The chip's VCEK.
    pub vcek: TestVcek,
    /// The fields of every report it makes (the report data is what `inblob` holds).
    pub spec: ReportSpec,
}

/// A TCB (Milan layout): bootloader 3, tee 0, snp 8, microcode 115.
pub const TEST_TCB: u64 = u64::from_le_bytes([3, 0, 0, 0, 0, 0, 8, 115]);

impl FakeSnpPlatform {
    /// A Milan platform with a fresh PKI and a VCEK at `TEST_TCB`, making reports per `spec`.
    pub fn new(spec: ReportSpec) -> FakeSnpPlatform {
        let amd = TestAmd::new(Product::Milan);
        let vcek = amd.vcek(&[0x5a; 64], TEST_TCB, PKI_NOT_BEFORE, PKI_NOT_AFTER);
        FakeSnpPlatform { amd, vcek, spec }
    }

    /// The report maker for [`FakeTsm::start`]; `tamper` changes each signed report.
    pub fn maker(self: &Arc<Self>, tamper: Option<fn(&mut Vec<u8>)>) -> Arc<ReportFn> {
        let me = self.clone();
        Arc::new(move |inblob: &[u8; 64]| {
            let mut spec = me.spec.clone();
            spec.report_data = *inblob;
            let mut r = me.vcek.report(&spec);
            if let Some(t) = tamper {
                t(&mut r);
            }
            (r, cert_table(&me.amd, &me.vcek))
        })
    }
}
